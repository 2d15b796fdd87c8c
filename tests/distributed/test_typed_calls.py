"""The typing contract of ``WorkerGroup.call``: a type checker sees the worker method's own signature and the
gathered return type, and rejects a method of another worker class. Runs mypy where it is installed (it is not a
runtime dependency), so this is skipped otherwise."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = textwrap.dedent('''
    from hybridrl.runtime import Worker, WorkerGroup, dp_leaders, dp_split, gather, one_to_all, rank_zero
    from hybridrl.protocol import Batch

    class Base(Worker):
        @one_to_all
        def ping(self) -> int: return 1

    class Critic(Base):
        @dp_split
        def values(self, batch: Batch, scale: float = 1.0) -> Batch: return batch
        @dp_split(pad=False)
        def update(self, batch: Batch) -> dict[str, float]: return {}
        @one_to_all(collect="first")
        def save(self, path: str) -> str: return path
        @rank_zero
        def name(self) -> str: return ""
        @dp_leaders
        def generate(self, batch: Batch) -> Batch: return batch

    class Other(Worker):
        @one_to_all
        def other(self) -> int: return 1

    def controller(group: WorkerGroup[Critic], batch: Batch) -> None:
        reveal_type(group.call(Critic.values, batch, scale=2.0))
        reveal_type(group.call(Critic.update, batch))
        reveal_type(group.call(Critic.save, "dir"))
        reveal_type(group.call(Critic.name))
        reveal_type(group.call(Critic.generate, batch))
        reveal_type(group.call(Critic.ping))
        reveal_type(gather(group.call_async(Critic.values, batch), group.call_async(Critic.update, batch)))
        group.call(Critic.values, "not a batch")
        group.call(Critic.values, batch, scal=2.0)
        group.call(Other.other)
''')

SKIPPED_PACKAGES = ("torch", "ray", "transformers", "numpy", "vllm", "safetensors", "tokenizers", "huggingface_hub",
                    "omegaconf", "hydra", "pyarrow", "rich", "psutil", "peft", "torchao")

EXPECTED_TYPES = [
    "hybridrl.protocol.batch.Batch",
    "builtins.list[builtins.dict[builtins.str, builtins.float]]",
    "builtins.str",
    "builtins.str",
    "hybridrl.protocol.batch.Batch",
    "builtins.list[builtins.int]",
    "tuple[hybridrl.protocol.batch.Batch, builtins.list[builtins.dict[builtins.str, builtins.float]]]",
]


@pytest.mark.slow
def test_group_calls_are_typed_by_the_worker_method(tmp_path: Path):
    mypy_api = pytest.importorskip("mypy.api")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    # The contract lives in hybridrl.runtime; the libraries under it are read as Any (analysing torch took 30 s).
    settings = tmp_path / "mypy.ini"
    settings.write_text("[mypy]\n" + "".join(f"[mypy-{package}.*]\nfollow_imports = skip\n"
                                               for package in SKIPPED_PACKAGES))
    out, _, _ = mypy_api.run([str(probe), f"--config-file={settings}", "--follow-imports=silent",
                              "--show-error-codes", "--no-pretty", f"--cache-dir={tmp_path / 'cache'}",
                              f"--python-executable={sys.executable}"])
    revealed = [re.sub(r"builtins\.", "", t) for t in re.findall(r'Revealed type is "(.*)"', out)]
    assert revealed == [t.replace("builtins.", "") for t in EXPECTED_TYPES], out
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 3, out
    assert 'incompatible type "str"; expected "Batch"' in errors[0]
    assert 'Unexpected keyword argument "scal"' in errors[1]
    assert "DispatchedMethod[Other" in errors[2]
