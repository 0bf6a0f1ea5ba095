"""HumanEval execution: a right completion passes, a wrong one fails, a hang times out, and the sandbox stops
network, subprocesses and file writes or deletions outside its temporary directory."""

import os

import pytest

from jf_jax.eval.code_execution import (ExecutionResult, build_program, check_completion, completion_code,
                                       pass_at_1)

PROBLEM = {"task_id": "Test/0", "entry_point": "add",
           "prompt": 'import math\n\n\ndef add(a, b):\n    """Add two numbers."""\n',
           "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"}


def _answer(body: str) -> str:
    return f"Here you go:\n```python\ndef add(a, b):\n{body}\n```\nDone."


def test_right_answers_pass_in_both_forms():
    assert check_completion(PROBLEM, _answer("    return a + b")).passed
    assert check_completion(PROBLEM, "    return a + b\n").passed  # a continuation of the body
    assert "check(add)" in build_program(PROBLEM, _answer("    return a + b"))


def test_wrong_answers_fail_with_the_reason():
    result = check_completion(PROBLEM, _answer("    return a - b"))
    assert result.status == "failed" and "AssertionError" in result.detail
    assert check_completion(PROBLEM, _answer("    return a +")).status == "failed"  # a syntax error
    assert check_completion(PROBLEM, "").status == "no_code"


def test_a_hang_times_out():
    result = check_completion(PROBLEM, _answer("    while True:\n        pass"), timeout=2)
    assert result == ExecutionResult(False, "timeout", "no result within 2 s")


@pytest.mark.parametrize("attack", [
    "    import socket\n    socket.create_connection(('127.0.0.1', 9))",
    "    import subprocess\n    subprocess.run(['true'])",
    "    import os\n    os.system('true')",
    "    open('/tmp/jf_sandbox_escape', 'w').write('x')",
    "    import os\n    os.remove('program.py')",
    "    import shutil\n    shutil.rmtree('/tmp')",
])
def test_the_sandbox_refuses(attack):
    result = check_completion(PROBLEM, _answer(attack + "\n    return a + b"))
    assert result.status == "failed" and "PermissionError" in result.detail
    assert not os.path.exists("/tmp/jf_sandbox_escape")


def test_writing_inside_its_directory_is_allowed():
    body = "    with open('scratch.txt', 'w') as f:\n        f.write('ok')\n    return a + b"
    assert check_completion(PROBLEM, _answer(body)).passed


def test_code_extraction_and_pass_at_1():
    assert completion_code("```py\nx = 1\n```\ntext\n```python\ny = 2\n```") == "x = 1\n\ny = 2"
    assert completion_code("no fence") == "no fence"
    assert pass_at_1([ExecutionResult(True, "passed"), ExecutionResult(False, "failed")]) == 0.5
    assert pass_at_1([]) == 0.0


def test_memory_is_limited():
    result = check_completion(PROBLEM, _answer("    block = bytearray(4 << 30)\n    return a + b"))
    assert result.status == "failed" and "MemoryError" in result.detail
