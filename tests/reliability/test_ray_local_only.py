"""Ray starts local-only by default: every socket its processes listen on is loopback, no dashboard, and nothing
(no auth token) is written to the user's home. The default runtime runs in a subprocess with a fresh ``HOME`` and
without the suite's ``RAY_*`` variables, so hybridrl's own defaults (``ray_runtime``) are what is tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed

PROBE = r'''
import sys
if sys.argv[1] == "ray_first":  # a notebook that imported ray itself before hybridrl
    import ray
from hybridrl.runtime.ray_runtime import start_ray  # sets Ray's environment defaults
import json, os, psutil, ray

@ray.remote
def pid():
    return os.getpid()

listening = []
with start_ray() as runtime:
    ray.get(pid.remote())  # a worker process is up too
    me = psutil.Process()
    for process in [me] + me.children(recursive=True):
        try:
            for connection in process.net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN or (connection.type == 2 and connection.laddr):
                    listening.append([process.name(), connection.laddr.ip, connection.laddr.port])
        except psutil.NoSuchProcess:
            pass
print("PROBE" + json.dumps(listening))
'''


def is_loopback(ip: str) -> bool:
    import ipaddress

    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


@pytest.mark.parametrize("import_order", ["hybridrl_first", "ray_first"])
def test_default_ray_runtime_listens_on_loopback_only_and_writes_nothing_home(tmp_path, import_order):
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(HOME=str(home), PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    process = subprocess.run([sys.executable, "-c", PROBE, import_order], capture_output=True, text=True, env=env, timeout=240)
    assert process.returncode == 0, process.stderr[-3000:]
    listening = json.loads(process.stdout.split("PROBE", 1)[1])
    names = {name for name, _, _ in listening}
    assert {"gcs_server", "raylet"} <= names, listening  # the probe sees Ray's servers
    assert [entry for entry in listening if not is_loopback(entry[1])] == []
    assert not [entry for entry in listening if entry[2] == 8265]  # the dashboard's port
    assert "dashboard" not in " ".join(names)
    assert sorted(str(path.relative_to(home)) for path in home.rglob("*")) == []
