"""`ratrain simulate --link-bandwidth/--link-latency` simulates on the profile with those
link fields replaced: the same step as simulate() on with_link(profile), and a slower
link costs a data-parallel step more."""
import json

import pytest

from cluster_helpers import compile_tiny, ratrain
from ratrain.cluster.scaling import with_link


def simulated(program, *flags) -> float:
    done = ratrain("simulate", program, "--json", *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["step_time_s"]


@pytest.mark.slow
def test_link_override_is_the_profile_with_that_link(tmp_path):
    from ratrain.compiler import recompile
    from ratrain.programs import read_manifest
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


def test_simulate_on_a_cluster_that_is_not_up_is_one_line(tmp_path):
    import os
    program = compile_tiny(tmp_path / "pp2", "--pp", 2, "--micro-batches", 2)
    env = dict(os.environ, RATRAIN_CLUSTER_STATE=str(tmp_path / "state"))
    done = ratrain("simulate", program, "--cluster", "nosuch", env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "ratrain: error: no cluster nosuch is up: `ratrain cluster up nosuch -n N` (and "
        "`ratrain cluster probe nosuch`) first"]
