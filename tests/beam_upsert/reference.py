"""A deliberately plain reference model of the upsert, written apart from the
package so the tests do not compare the code with itself.

The documented rules it models (beam_upsert.model's docstring):

* per key and time the greatest offset wins; on equal offsets a value beats a
  delete and then the greatest (type name, repr) wins;
* offsets only order inside their class (numbers, str, bytes, tuples of one
  length with parts of one class); a key holding a value keeps the class of
  the offsets that made it and refuses others; a key holding nothing keeps,
  at each time, the class most of that time's commands use (ties: numbers,
  str, bytes, tuples — shorter first, then by their parts);
* a key that ends a time without a value forgets its class;
* duplicate snapshot keys keep the greatest value by that same order and
  report every other value that differs, for keys some command touches.
"""

from decimal import Decimal


def offset_kind(offset):
    """A sortable description of the offset's class."""
    if isinstance(offset, tuple):
        return (3, len(offset)) + tuple(offset_kind(part) for part in offset)
    if isinstance(offset, (bool, int, float, Decimal)):
        return (0,)
    if isinstance(offset, str):
        return (1,)
    return (2,)


def tie_order(value):
    return (value is not None, type(value).__name__, repr(value))


def reference(commands, prior=(), resume_at=None):
    """commands: (key, value, offset, time); prior: (key, value) pairs.

    Returns:
        ``(changes, invalid)``: sorted ``(key, value, diff, time)`` changes,
        and the sorted refused elements: ``(key, value, offset)`` commands and
        ``(key, value)`` snapshot duplicates.
    """
    kept = [c for c in commands if resume_at is None or c[3] >= resume_at]
    by_key = {}
    for key, value, offset, time in kept:
        by_key.setdefault(key, {}).setdefault(time, []).append((offset, value))
    snapshot = {}
    for key, value in prior:
        snapshot.setdefault(key, []).append(value)
    out, invalid = [], []
    for key, times in by_key.items():
        values = sorted(snapshot.get(key, []), key=tie_order)
        current = values[-1] if values else None
        invalid += [(key, v) for v in values[:-1] if v != current]
        live_kind = None
        for time in sorted(times):
            group = times[time]
            kinds = [offset_kind(o) for o, _ in group]
            if live_kind is not None:
                want = live_kind
            else:
                want = min(set(kinds), key=lambda k: (-kinds.count(k), k))
            invalid += [(key, v, o) for (o, v), k in zip(group, kinds) if k != want]
            group = [c for c, k in zip(group, kinds) if k == want]
            if not group:
                continue
            top = max(o for o, _ in group)
            new = max((v for o, v in group if o == top), key=tie_order)
            live_kind = want
            if new != current:
                if current is not None:
                    out.append((key, current, -1, time))
                if new is not None:
                    out.append((key, new, 1, time))
                current = new
            if current is None:
                live_kind = None
    return sorted(out, key=repr), sorted(invalid, key=repr)


def reference_upsert(commands, prior=(), resume_at=None):
    """The changes of :func:`reference`, sorted."""
    return reference(commands, prior, resume_at)[0]
