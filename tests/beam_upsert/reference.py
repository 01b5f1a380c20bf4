"""A deliberately plain reference model of the upsert, written apart from the
package so the tests do not compare the code with itself."""


def reference_upsert(commands, prior=(), resume_at=None):
    """commands: (key, value, offset, time); prior: (key, value).

    Returns a sorted list of (key, value, diff, time)."""
    current = dict(prior)
    best = {}
    for key, value, offset, time in commands:
        if resume_at is not None and time < resume_at:
            continue
        slot = (key, time)
        if slot not in best or offset > best[slot][0]:
            best[slot] = (offset, value)
    out = []
    for key, time in sorted(best, key=lambda s: (s[1], repr(s[0]))):
        new = best[(key, time)][1]
        old = current.get(key)
        if new == old:
            continue
        if old is not None:
            out.append((key, old, -1, time))
        if new is not None:
            out.append((key, new, 1, time))
            current[key] = new
        else:
            current.pop(key, None)
    return sorted(out, key=repr)
