"""The templated jobs: what operators schedule, each a module with ``run`` and ``main``.

=========================  ==============================  =============================
module                     console script                  in the repository
=========================  ==============================  =============================
``upsert_to_supertable``   ``beam-supertable-upsert``      ``python -m pipelines.upsert_to_supertable``
``load_supertable``        ``beam-supertable-load``        ``python -m pipelines.load_supertable``
``search_supertable``      ``beam-supertable-search``      ``python -m pipelines.search_supertable``
``optimize_supertable``    ``beam-supertable-optimize``    ``python -m pipelines.optimize_supertable``
``upsert_changes``         ``beam-upsert-changes``         ``python -m pipelines.upsert_changes``
=========================  ==============================  =============================

They share :mod:`beam_supertable.jobs.options`: strict flags (an unknown one
stops the job, exit 2), one-line errors (exit 1), exit 3 when more input was
rejected than ``--max-invalid`` allows, dead letters that a rerun never
erases. Their sample inputs ship in ``samples/``.
"""
