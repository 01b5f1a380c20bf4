"""Reading what a job wrote, for comparing two runs of it."""
import json


def job_outputs(output: str):
    """``(lines, dead letters)`` of a run writing ``output``, both sorted.

    Dead letters carry the id of the run that wrote them; two runs of the same
    input differ only there, so it is left out of the comparison.
    """
    with open(output) as f:
        lines = sorted(f)
    with open(output + ".invalid.jsonl") as f:
        letters = [json.loads(line) for line in f]
    for letter in letters:
        assert letter.pop("run")
    return lines, sorted(letters, key=lambda r: json.dumps(r, sort_keys=True))
