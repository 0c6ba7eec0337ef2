"""Every field a hardware profile may hold is documented in the one table of
docs/DESIGN.md section 7.1 (hw/profiles.py refers there): the built-in profiles' fields,
their `threads` entries' fields, and every field the loader requires."""
import re
from pathlib import Path

from ratrain.hw import load_profile
from ratrain.hw.profiles import NUMBER_FIELDS, known_profiles

DESIGN = Path(__file__).parents[2] / "docs" / "DESIGN.md"


def documented_fields() -> set[str]:
    """The backquoted names in the first column of section 7.1's field table."""
    text = DESIGN.read_text()
    section = text[text.index("### 7.1 "):text.index("### 7.2 ")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}


def test_every_profile_field_is_in_the_design_table():
    documented = documented_fields()
    assert {"name", "link_bandwidth", "op_costs", "threads"} <= documented
    for name in known_profiles():
        profile = load_profile(name)
        fields = set(profile) | {f for entry in profile.get("threads", {}).values()
                                 for f in entry}
        assert fields <= documented, (name, fields - documented)
    assert set(NUMBER_FIELDS) <= documented
