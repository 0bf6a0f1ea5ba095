"""Studies: the pipeline prompts -> collect -> train -> evaluate, described by one YAML file and run by one resumable,
time-boxed command (``jf-jax study configs/studies/NAME.yaml``).

- ``spec``: the study file's schema (frozen dataclasses), read and checked whole before anything runs.
- ``plan``: the study as a list of stages, each one ``jf-jax COMMAND ...`` (pure: paths and arguments).
- ``runner``: runs the stages as subprocesses, records each finished one in the run directory's state file, stops
  at a time limit, and skips what is done when the same command runs again.
- ``curve``: the learning-curve report of a study trained at several data sizes.
- ``command``: the ``jf-jax study`` command line.

Every stage is a package command in a process of its own (``sys.executable -m jf_jax COMMAND``): its log is a file
of the run directory, its work resumes the way the command resumes it, and nothing of a stage lives in the runner.
"""
