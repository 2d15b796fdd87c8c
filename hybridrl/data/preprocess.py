"""Turn raw datasets into prompt files with verl's row schema (:mod:`hybridrl.data.records`).

GSM8K::

    python -m hybridrl.data.preprocess gsm8k --input ../shared/data/gsm8k --output data/gsm8k [--limit N]

reads ``train.jsonl`` / ``test.jsonl`` (``{"question", "answer"}`` per line, the answer's last line ``#### N``) and
writes ``train.parquet`` / ``test.parquet`` with rows::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "<question>\\n<instruction to end with '#### <answer>'>"}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "1080"},     # thousands separators removed
     "extra_info": {"split": "train", "index": 17, "question": "...", "answer": "<full worked solution>"}}

``--tool-agent`` writes verl's multi-turn tool layout instead (its ``gsm8k_tool_agent_loop.py``): a system message
asking for the ``calc_gsm8k_reward`` tool, ``"agent_name": "tool_agent"`` and the tool's per-row argument in
``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth`` — for ``rollout.multi_turn`` with
``conf/tool_configs/gsm8k_tool_config.yaml``.

The synthetic arithmetic task can be exported the same way (``arithmetic --output DIR``) to inspect it or to
train from files; ``word-problems --output DIR`` writes the chat-format word problems of
:mod:`hybridrl.data.word_problems` (the SmolLM2 recipe's task). Generated files are build outputs: do not commit them.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridrl.data.io import read_rows, write_rows
from hybridrl.data.synthetic import ArithmeticTask
from hybridrl.data.word_problems import WordProblems

__all__ = ["GSM8K_DATA_SOURCE", "GSM8K_INSTRUCTION", "GSM8K_TOOL_NAME", "gsm8k_final_answer", "gsm8k_rows",
           "preprocess_gsm8k", "export_arithmetic", "export_word_problems", "main"]

GSM8K_DATA_SOURCE = "openai/gsm8k"
GSM8K_INSTRUCTION = 'Reason step by step, then give the final answer on the last line as "#### <number>".'
GSM8K_TOOL_NAME = "calc_gsm8k_reward"
GSM8K_TOOL_SYSTEM_PROMPT = (f"Solve the math problem step by step. Before your final answer, check it with the "
                            f"{GSM8K_TOOL_NAME} tool at least once, and correct it if the tool says it is wrong.")
_WHOLE_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def gsm8k_final_answer(answer: str, where: str) -> str:
    """The number after the last ``#### `` of a GSM8K solution, thousands separators removed (``1,080`` → ``1080``).

    Raises:
        ValueError: starting with ``where`` if there is no ``####`` or what follows is not a number.
    """
    marker = answer.rfind("####")
    if marker < 0:
        raise ValueError(f"{where}: the answer has no '####' line with the final answer")
    final = answer[marker + 4:].strip().replace(",", "")
    if not _WHOLE_NUMBER.fullmatch(final):
        raise ValueError(f"{where}: the final answer {answer[marker + 4:].strip()!r} is not a number")
    return final


def gsm8k_rows(path: str | Path, split: str, limit: int | None = None,
               tool_agent: bool = False) -> list[dict[str, Any]]:
    """Rows in the prompt schema for one GSM8K JSONL file (the first ``limit`` problems if given); ``tool_agent``:
    verl's multi-turn tool layout (module docstring)."""
    rows = []
    for index, source in enumerate(read_rows(path).rows[:limit]):
        question, answer = source.row.get("question"), source.row.get("answer")
        for key, value in (("question", question), ("answer", answer)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{source.where}: '{key}' must be a non-empty string, got {value!r}")
        final = gsm8k_final_answer(answer, source.where)
        row = {
            "data_source": GSM8K_DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question.strip()}\n{GSM8K_INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": final},
            "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
        }
        rows.append(_as_tool_agent_row(row, final) if tool_agent else row)
    return rows


def _as_tool_agent_row(row: dict[str, Any], final: str) -> dict[str, Any]:
    """``row`` in verl's multi-turn tool layout: the tool asked for, the row's agent loop and the tool's argument."""
    row["prompt"] = [{"role": "system", "content": GSM8K_TOOL_SYSTEM_PROMPT}, *row["prompt"]]
    row["agent_name"] = "tool_agent"
    row["extra_info"].update(need_tools_kwargs=True,
                             tools_kwargs={GSM8K_TOOL_NAME: {"create_kwargs": {"ground_truth": final}}})
    return row


def preprocess_gsm8k(input_dir: str | Path, output_dir: str | Path, *, splits: Sequence[str] = ("train", "test"),
                     limit: int | None = None, tool_agent: bool = False) -> dict[str, Path]:
    """Write ``<output_dir>/<split>.parquet`` for each split's ``<input_dir>/<split>.jsonl``; returns the paths."""
    outputs = {}
    for split in splits:
        rows = gsm8k_rows(Path(input_dir) / f"{split}.jsonl", split, limit, tool_agent)
        outputs[split] = write_rows(rows, Path(output_dir) / f"{split}.parquet")
    return outputs


def export_arithmetic(output_dir: str | Path, *, seed: int = 1, num_train: int = 8192, num_val: int = 256,
                      **options: Any) -> dict[str, Path]:
    """Write the arithmetic task's first ``num_train`` training rows and its held-out set as parquet."""
    task = ArithmeticTask(seed=seed, num_train=num_train, num_val=num_val, **options)
    return {"train": write_rows(task.train_rows(), Path(output_dir) / "train.parquet"),
            "val": write_rows(task.validation_rows(), Path(output_dir) / "val.parquet")}


def export_word_problems(output_dir: str | Path, *, seed: int = 1, num_train: int = 4096,
                         num_val: int = 200) -> dict[str, Path]:
    """Write ``num_train`` training and ``num_val`` held-out word problems as parquet."""
    task = WordProblems(seed=seed)
    return {"train": write_rows(task.rows("train", num_train), Path(output_dir) / "train.parquet"),
            "val": write_rows(task.rows("val", num_val), Path(output_dir) / "val.parquet")}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hybridrl.data.preprocess",
                                     description="Turn raw datasets into parquet prompt files with verl's row schema.")
    commands = parser.add_subparsers(dest="dataset", required=True)
    gsm8k = commands.add_parser("gsm8k", help="GSM8K JSONL (train/test) -> parquet")
    gsm8k.add_argument("--input", required=True, help="folder with train.jsonl and test.jsonl")
    gsm8k.add_argument("--output", required=True, help="folder for train.parquet and test.parquet")
    gsm8k.add_argument("--limit", type=int, default=None, help="only the first N problems of each split")
    gsm8k.add_argument("--tool-agent", action="store_true",
                       help="verl's multi-turn tool layout (agent_name, tools_kwargs) for rollout.multi_turn")
    arithmetic = commands.add_parser("arithmetic", help="the synthetic arithmetic task -> parquet")
    arithmetic.add_argument("--output", required=True, help="folder for train.parquet and val.parquet")
    arithmetic.add_argument("--seed", type=int, default=1)
    arithmetic.add_argument("--num-train", type=int, default=8192)
    arithmetic.add_argument("--num-val", type=int, default=256)
    words = commands.add_parser("word-problems", help="chat-format arithmetic word problems -> parquet")
    words.add_argument("--output", required=True, help="folder for train.parquet and val.parquet")
    words.add_argument("--seed", type=int, default=1)
    words.add_argument("--num-train", type=int, default=4096)
    words.add_argument("--num-val", type=int, default=200)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2 with a one-line message on bad input)."""
    args = _parser().parse_args(argv)
    try:
        if args.dataset == "gsm8k":
            outputs = preprocess_gsm8k(args.input, args.output, limit=args.limit, tool_agent=args.tool_agent)
        elif args.dataset == "word-problems":
            outputs = export_word_problems(args.output, seed=args.seed, num_train=args.num_train, num_val=args.num_val)
        else:
            outputs = export_arithmetic(args.output, seed=args.seed, num_train=args.num_train, num_val=args.num_val)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for split, path in outputs.items():
        print(f"{split}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
