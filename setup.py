"""Builds the package for Beam's remote workers: ``--setup_file ./setup.py``.

Everything is declared in ``pyproject.toml``; this shim exists because Beam
releases before 2.63 build a pipeline's package only from a ``setup.py``
(``python setup.py sdist``, or ``python -m build --no-isolation`` when
``build`` is installed), in the launching environment, with its setuptools.
"""

import sys

import setuptools

NEEDED = 77   # the first setuptools that reads pyproject.toml's SPDX ``license``

if int(setuptools.__version__.split(".")[0]) < NEEDED:
    sys.exit(f"setup.py: building beam-upsert-supertable needs setuptools>={NEEDED}, and this "
             f"environment has {setuptools.__version__}; run: pip install 'setuptools>={NEEDED}'")

setuptools.setup()
