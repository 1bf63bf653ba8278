"""The contracts every command shares, each written once (docs/architecture.md "Contracts").

Standard library only, so that any layer can import it without pulling in the rest.

Exit codes: 0 pass / go, 1 checks failed / no-go, 2 usage or bad input, 3 hosts unreachable or
evidence incomplete. When one command has several results (hosts, probes, slices, stages),
``combine`` picks the code it exits with: a usage error (2) says the command itself was wrong,
so it wins; then a definite failure (1), since a known no-go must not be retried by a caller that
retries on 3; then missing evidence (3); 0 only when every part passed.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3

EXIT_CODES = (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE)

# Highest first: the code that wins when several apply.
_PRECEDENCE = (EXIT_USAGE, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK)


def combine(*codes: int | Iterable[int], empty: int = EXIT_INCOMPLETE) -> int:
    """One exit code for several results: 2 over 1 over 3 over 0.

    Each argument is a code or an iterable of codes. With no codes at all the result is
    ``empty`` (nothing was measured: evidence incomplete, unless the caller says otherwise).
    """
    seen: set[int] = set()
    for c in codes:
        if isinstance(c, int):
            seen.add(c)
        else:
            seen.update(c)
    if not seen:
        return empty
    unknown = seen.difference(EXIT_CODES)
    if unknown:
        raise ValueError(f"not a k3fleet exit code: {sorted(unknown)}")
    return next(c for c in _PRECEDENCE if c in seen)
