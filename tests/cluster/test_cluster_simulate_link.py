"""`ratrain simulate --link-bandwidth/--link-latency` simulates on the profile with those
link fields replaced: the same step as simulate() on with_link(profile), and a slower
link costs a data-parallel step more."""
import json

from cluster_helpers import compile_tiny, ratrain
from ratrain.cluster.scaling import with_link


def simulated(program, *flags) -> float:
    done = ratrain("simulate", program, "--json", *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["step_time_s"]


def test_link_override_is_the_profile_with_that_link(tmp_path):
    from ratrain.cli_compile import read_manifest, recompile
    from ratrain.sim import simulate
    program = compile_tiny(tmp_path / "dp2", "--dp", 2, "--micro-batches", 2)
    manifest = read_manifest(program)
    expected = simulate(recompile(manifest), with_link(manifest["hw"], 61.7e6, 2e-5))
    assert simulated(program, "--link-bandwidth", "61.7MB/s", "--link-latency", "20us") \
        == expected.step_time
    assert simulated(program, "--link-bandwidth", "20MB/s") > \
        simulated(program, "--link-bandwidth", "200MB/s")
    bad = ratrain("simulate", program, "--link-latency", "soon")
    assert bad.returncode == 2 and "latency 'soon'" in bad.stderr
