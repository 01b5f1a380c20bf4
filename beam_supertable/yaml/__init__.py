"""Beam YAML: the supertable transforms by name, from the provider file shipped here.

A pipeline loads them with ``providers: [{include: PATH}]``, PATH being this
package's ``providers.yaml`` (``python -m beam_supertable.yaml`` prints it):
``WriteToSupertable``, ``ReadFromSupertable``, ``UpsertToSupertable``,
``ReadChangesFromSupertable`` and ``SearchSupertable``, each taking and giving
schema'd Rows (:mod:`beam_supertable.yaml.transforms` and
:mod:`beam_supertable.yaml.reads`). This folder sits with the jobs, over the
Beam transforms and the table: it may import any layer below it.
"""

import os

__all__ = ["PROVIDERS", "TRANSFORMS", "providers_path"]

PROVIDERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "providers.yaml")

# The YAML names and the callables providers.yaml maps them to.
TRANSFORMS = {
    "WriteToSupertable": "beam_supertable.yaml.transforms.WriteToSupertable",
    "UpsertToSupertable": "beam_supertable.yaml.transforms.UpsertToSupertable",
    "ReadFromSupertable": "beam_supertable.yaml.reads.ReadFromSupertable",
    "ReadChangesFromSupertable": "beam_supertable.yaml.reads.ReadChangesFromSupertable",
    "SearchSupertable": "beam_supertable.yaml.reads.SearchSupertable",
}


def providers_path() -> str:
    """The path of the shipped ``providers.yaml``, for ``providers: [{include: ...}]``."""
    return PROVIDERS
