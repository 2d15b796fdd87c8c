"""The command line prints clear errors (exit 2) and the resolved config with its batch plan."""

from __future__ import annotations

import subprocess
import sys

from hybridrl.cli import main


def test_config_command_prints_resolved_config_and_plan(capsys):
    assert main(["config", "--no-check-paths", "rollout.n=2", "data.train_batch_size=8"]) == 0
    out = capsys.readouterr().out
    assert "adv_estimator: grpo" in out
    assert "# actor: 8 prompts × n=2 = 16 sequences per step" in out
    assert "4 per micro-batch × 2 accumulation steps" in out


def test_bad_override_exits_2_with_message(capsys):
    assert main(["config", "--no-check-paths", "rollout.n=0"]) == 2
    err = capsys.readouterr().err
    assert "rollout.n=0: must be a positive number" in err
    assert "Traceback" not in err


def test_cli_logging_shows_hybridrl_info_lines_through_the_current_stderr(capsys):
    import logging

    from hybridrl.cli import configure_logging

    configure_logging()
    configure_logging()  # idempotent: one handler, one line per record
    logging.getLogger("hybridrl.trainers.rl_trainer").info("micro-batch sized: 4 x 2")
    logging.getLogger("some.library").info("chatter a user does not need")
    err = capsys.readouterr().err    # capsys swaps sys.stderr: the handler must follow it, not keep the old stream
    assert err.count("micro-batch sized: 4 x 2") == 1
    assert "chatter" not in err


def test_rm_command_refuses_a_config_without_pairs(capsys):
    assert main(["rm", "--no-check-paths", "data.train_batch_size=16"]) == 2
    err = capsys.readouterr().err
    assert "hybridrl rm:" in err and "data.train_files" in err and "Traceback" not in err


def test_a_run_that_inherits_sigint_ignored_says_ctrl_c_will_not_stop_it(capsys, monkeypatch):
    import signal

    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_IGN if signum == signal.SIGINT else None)
    assert main(["train", "--no-check-paths", "rollout.n=0"]) == 2
    err = capsys.readouterr().err
    assert "SIGINT is ignored in this process" in err and "Ctrl-C will not stop `hybridrl train`" in err


def test_a_run_with_the_default_sigint_handler_gives_no_such_warning(capsys, monkeypatch):
    """(The handler is set for the test: a test process started in the background, or a test before this one in the
    same xdist worker, may have SIGINT ignored for real.)"""
    import signal

    monkeypatch.setattr(signal, "getsignal",
                        lambda signum: signal.default_int_handler if signum == signal.SIGINT else None)
    assert main(["train", "--no-check-paths", "rollout.n=0"]) == 2
    assert "SIGINT is ignored" not in capsys.readouterr().err


def test_help_and_the_parser_load_neither_torch_nor_transformers():
    """``hybridrl --help`` answers in a fraction of a second: building the parser (which lists the planner's GPU
    types and every command's options) imports no torch, transformers, vLLM or Ray (it took 3.6 s when it did)."""
    code = ("import sys; from hybridrl.cli import build_parser; build_parser(); "
            "print(sorted(name for name in ('torch', 'transformers', 'vllm', 'ray') if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_config_dir_adds_a_users_own_configs_that_build_on_the_built_in_ones(tmp_path, capsys):
    """Hydra's ``--config-dir``: the user's YAML names a built-in config in its defaults list; a user's group option
    sits beside the built-in ones."""
    (tmp_path / "my_grpo.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\nrollout:\n  n: 2\n")
    (tmp_path / "algorithm").mkdir()
    (tmp_path / "algorithm" / "mine.yaml").write_text("adv_estimator: rloo\n")
    assert main(["config", "--no-check-paths", "--config-dir", str(tmp_path), "--config-name", "my_grpo",
                 "algorithm=mine", "data.train_batch_size=6", "actor.ppo_mini_batch_size=6",
                 "actor.ppo_micro_batch_size_per_gpu=2"]) == 0
    out = capsys.readouterr().out
    assert "adv_estimator: rloo" in out and "  'n': 2\n" in out
    assert "# actor: 6 prompts × n=2 = 12 sequences per step" in out


def test_config_path_replaces_the_built_in_configs(tmp_path, capsys):
    from hybridrl.config import config_dir
    import shutil

    shutil.copytree(config_dir(), tmp_path / "conf")
    (tmp_path / "conf" / "algorithm" / "grpo.yaml").write_text("adv_estimator: rloo\n")
    assert main(["config", "--no-check-paths", "--config-path", str(tmp_path / "conf")]) == 0
    assert "adv_estimator: rloo" in capsys.readouterr().out


def test_config_dirs_that_do_not_exist_or_hold_no_such_config_are_named(tmp_path, capsys):
    assert main(["config", "--no-check-paths", "--config-dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "--config-dir" in err and "no such directory" in err and "Traceback" not in err
    assert main(["config", "--no-check-paths", "--config-dir", str(tmp_path), "--config-name", "mine"]) == 2
    err = capsys.readouterr().err
    assert "no mine.yaml in" in err and str(tmp_path) in err and "ppo_trainer" in err
