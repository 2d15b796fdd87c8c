"""``hybridrl serve``: a model directory served behind the OpenAI-compatible API in a process of its own (vLLM CPU
build), called with the real ``openai`` client and stopped by SIGTERM; its start-up mistakes exit 2 with one line
naming the option or path, before anything loads."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading

import pytest

from hybridrl.cli import main
from hybridrl.utils.tiny_model import save_tiny_model

openai = pytest.importorskip("openai", reason="needs the openai client (pip install 'hybridrl[test]')")
pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("serve") / "tiny-chat", tool_chat=True)


def first_line_with(process: subprocess.Popen, text: str, timeout_s: float) -> str:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    while True:
        line = lines.get(timeout=timeout_s)
        if text in line:
            return line


def test_a_served_model_answers_the_openai_client_and_sigterm_stops_it(model_dir):
    process = subprocess.Popen([sys.executable, "-m", "hybridrl.cli", "serve", str(model_dir), "--port", "0",
                                "--dtype", "float32", "--max-model-len", "256", "--max-tokens", "32"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = first_line_with(process, " at http://", timeout_s=240)
        base_url = line.split(" at ", 1)[1].split()[0]
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        assert [model.id for model in client.models.list()] == ["tiny-chat"]
        reply = client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "2+2="}],
                                               max_tokens=8, seed=1)
        assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1
        with pytest.raises(openai.BadRequestError, match="over the gateway's limit of 32"):
            client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "x"}],
                                           max_tokens=33)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "hybridrl serve: terminated (SIGTERM)" in stderr


def test_serve_mistakes_exit_2_naming_the_option_or_path(model_dir, tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such checkpoint, run directory or model directory" in capsys.readouterr().err
    assert main(["serve", str(model_dir), "--host", "0.0.0.0"]) == 2
    assert "--host 0.0.0.0 exposes the model to the network: give --api-key" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", str(model_dir), "--port", str(port)]) == 2
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
