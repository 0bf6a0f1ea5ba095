"""Evaluation as library code: what ``jf-jax evaluate`` measures of a model, and the scores and tables other
reports (the decode command, the ablations, the benchmarks, the results index) share. Along the data flow:

* ``speed``: the timed runs of every method on a prompt set (``SpeedRun``), summarized by ``decoding.stats``,
  against AR's run of the same set (speedups, ``match_ar``).
* ``answer_quality``: the 4-gram repeat fraction of an answer and the loop rule.
* ``quality``: greedy AR answers scored: GSM8K accuracy, HumanEval pass@1 by execution, the teacher-forced NLL
  of HumanEval's canonical solutions.
* ``code_execution``: a HumanEval completion run against its problem's tests in a sandboxed subprocess.
* ``evaluation``: ``evaluate_model``, one model's speed runs and quality in one result.
* ``report``: the results in OUT.json and OUT.md, written atomically after each model and read back to resume.
* ``parts``: a multi-process evaluation: each process's share of every set, and the merge of the processes'
  parts into the one-process result.
* ``stats_table``: the one renderer of tables of ``decoding.stats`` summaries.
* ``code_quality``: a static check of the code answers an evaluation recorded (closed block, parses, defines the
  function).

The command line (``jf_jax.cli.evaluate``) parses and checks the options and prints; everything it measures is
here. The modules import JAX and the api inside their functions, so a command refuses bad options at once.
"""
