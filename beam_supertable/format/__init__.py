"""The objects on the store, and how they are read, written and committed.

- the store: :mod:`.store` (an fsspec filesystem with atomic create, retries,
  the probe), :mod:`.backends` (each backend's schemes, client library and
  answers), :mod:`.cache` (the handle's byte budget);
- a superfile: :mod:`.superfile` (the Parquet layout with its index
  sections), :mod:`.writer` (building and uploading superfiles),
  :mod:`.reader` (ranged reads of one), :mod:`.deletes` (deletion vectors),
  :mod:`.ids` (row ids and their claims);
- rows: :mod:`.schema`, :mod:`.keys` (primary keys), :mod:`.filters` and
  :mod:`.expression` (pruning by statistics), :mod:`.digest`,
  :mod:`.row_reasons` (why a row is refused);
- versions: :mod:`.manifest` (the optimistic-concurrency commit loop) over
  :mod:`.documents` (version and part documents), :mod:`.tokens`
  (idempotency tokens), :mod:`.vacuum`, and :mod:`.views`, the hook through
  which faces derived from the versions (the Iceberg metadata) are kept in step.

It imports the indexes (``vector/``, ``fts/``) and ``errors``; nothing from
``iceberg/``, ``table/`` or ``transforms/``.
"""
