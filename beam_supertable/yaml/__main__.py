"""``python -m beam_supertable.yaml``: prints the path of the shipped ``providers.yaml``."""

from beam_supertable.yaml import providers_path

if __name__ == "__main__":
    print(providers_path())
