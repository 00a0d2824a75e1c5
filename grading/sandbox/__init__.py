"""What a rank process that runs student code can reach (docs/sandbox.md): below the engine, above ``common``.

``limits``: resource limits, the namespaces a case's ranks share and the sweep of a run's marked processes (the
launcher's side); ``isolation``: the plan of a rank's view of the machine and the grader's reading of what ranks
wrote; ``rank_view``: the rank's own side, which enters that view before any student module is imported.
"""
