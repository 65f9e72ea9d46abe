"""Storage URLs, parsed strictly, with passwords kept out of every message.

    sqlite:///studies/NAME.db            the default: one file per study, one worker
    postgresql://user:pw@host/db         many workers on many hosts (heartbeats on)
    mysql://user:pw@host/db              the same, on MySQL
    journal:PATH                         Optuna's journal file: many workers on one host,
                                         no database server (JournalFileBackend)
    a bare PATH.db / PATH.journal        the same, for `compare` and `--warm-start-from`
    sqlite://                            in memory: gone when the process ends (no heartbeats)

Nothing else is a storage: a typo (`postgresql:/u:pw@host/db`, `notaurl`) is refused in one
line instead of becoming a SQLite file named after it. A password is hidden wherever a URL is
shown (`redact`, through SQLAlchemy's own URL parser, so what is hidden is what the driver
would send); a raw '@' inside a password is refused, because no parser can tell where such a
password ends (write it as %40). A study name is a plain name: it names a file.

A REF names one study: a storage and, when it holds more than one, `#NAME`
(`studies/gpt2-nvidia-a100.db`, `postgresql://tuner@db/autotune#gpt2-h200`).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, unquote

from autotune.errors import UsageError

STUDIES_DIR = Path("studies")  # where `search` keeps its studies by default
RDB_SCHEMES = ("postgresql", "postgres", "mysql")
STORAGE_FORMS = (
    "sqlite:///PATH.db, journal:PATH, postgresql://USER@HOST/DB, mysql://USER@HOST/DB, "
    "or a file path ending in .db or .journal"
)
# A study name becomes a file name (studies/NAME.db, recipes/NAME.json): letters, digits and
# . _ - only, not starting with a dot or a dash.
STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class StorageURL:
    """A storage, parsed: what kind, the URL Optuna opens, and its file (if it has one)."""

    kind: str  # "sqlite", "journal" or "rdb"
    url: str
    path: Path | None = None  # the database or journal file; None in memory and on a server

    @property
    def in_memory(self) -> bool:
        return self.kind == "sqlite" and self.path is None


def parse_storage_url(text: str) -> StorageURL:
    """The storage `text` names, or UsageError (one line, no password in it) for anything that
    is not one of STORAGE_FORMS."""
    if not isinstance(text, str) or not text or len(text) > 4096 or any(c in text for c in "\0\n\r"):
        raise UsageError(f"storage {_shown_raw(text)}: not a storage; expected {STORAGE_FORMS}")
    scheme, sep, rest = text.partition("://")
    if text.startswith("journal:"):
        path = text[len("journal:") :]
        if not path or path.endswith("/") or "://" in text:
            raise UsageError(f"storage {_shown_raw(text)}: expected journal:PATH, a file path after 'journal:'")
        return StorageURL("journal", text, Path(path))
    if sep and re.fullmatch(r"sqlite(\+\w+)?", scheme):
        return _sqlite(text, rest)
    if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(\+\w+)?", scheme):
        if scheme.split("+", 1)[0].lower() not in RDB_SCHEMES:
            raise UsageError(
                f"storage {_shown_raw(text)}: unknown kind of storage {scheme!r}; expected {STORAGE_FORMS}"
            )
        return _rdb(text)
    # A plain path. Something that starts like a URL (a scheme, then ':') is a mistyped URL,
    # not a file name: taken as a path it would create folders named after a password.
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", text) or sep:
        raise UsageError(
            f"storage {_shown_raw(text)}: not a valid URL (a slash missing?); expected {STORAGE_FORMS}. "
            "A file whose name holds ':' can be given as ./NAME"
        )
    if text.endswith(".journal"):
        return StorageURL("journal", f"journal:{text}", Path(text))
    if text.endswith(".db"):
        return StorageURL("sqlite", f"sqlite:///{text}", Path(text))
    raise UsageError(f"storage {_shown_raw(text)}: not a storage; expected {STORAGE_FORMS}")


def _sqlite(text: str, rest: str) -> StorageURL:
    if rest in ("", "/:memory:"):
        return StorageURL("sqlite", text, None)
    if not rest.startswith("/") or rest == "/":
        raise UsageError(f"storage {_shown_raw(text)}: expected sqlite:///PATH (three slashes, then the file)")
    path = rest[1:].split("?", 1)[0]
    if not path or path.endswith("/"):
        raise UsageError(f"storage {_shown_raw(text)}: expected sqlite:///PATH (three slashes, then the file)")
    return StorageURL("sqlite", text, Path(path))


def _rdb(text: str) -> StorageURL:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise UsageError(
            f"storage {_shown_raw(text)}: cannot read it as a database URL; expected {STORAGE_FORMS}"
        ) from None
    # SQLAlchemy reads user:pass@host up to the first '@': a second one lands in the host or
    # the database name, and the rest of the password with it, shown wherever they are.
    if "@" in (url.host or "") or "@" in (url.database or "") or (url.host and "/" in url.host):
        raise UsageError(
            f"storage {_shown_raw(text)}: more than one '@' before the host; write an '@' inside the password as %40"
        )
    if not url.host and not url.query.get("host"):
        raise UsageError(f"storage {_shown_raw(text)}: no host; expected {STORAGE_FORMS}")
    if not url.database:
        raise UsageError(f"storage {_redact_rdb(text)}: no database name after the host (.../DBNAME)")
    return StorageURL("rdb", text, None)


def default_storage_url(study_name: str) -> str:
    return f"sqlite:///{STUDIES_DIR / (study_name + '.db')}"


def check_study_name(name: str) -> str:
    """A study name names files (studies/NAME.db, recipes/NAME.json): a plain name only."""
    if not isinstance(name, str) or not STUDY_NAME.fullmatch(name):
        raise UsageError(
            f"--study {_shown_raw(name)}: a study name is letters, digits and . _ - (at most 128, not "
            "starting with . or -), because it names files"
        )
    return name


def redact(url: str) -> str:
    """The storage URL (or REF, with #NAME) with its password replaced by ***: safe to print,
    log or store. A database URL goes through SQLAlchemy's parser, so what is hidden is what
    the driver would send (user:PW@host, and a `password=` query parameter). A file storage has
    no password and is shown as it is; text that is no storage at all is cut at its last '@'."""
    if not isinstance(url, str):
        return "***"
    base, name = split_ref(url)
    suffix = f"#{name}" if name is not None else ""
    try:
        parsed = parse_storage_url(base)
    except UsageError:
        return _shown_raw(url, quote_it=False)
    if parsed.kind != "rdb":
        return base + suffix
    if suffix and re.search(r"[?&](password|passwd|pwd)=", base, flags=re.I):
        # A raw '#' in a query password (…&password=PW#RD) reads as PW and a study named RD:
        # the part after '#' may be the password's end, so it is not shown either.
        suffix = "#***"
    try:
        return _redact_rdb(base) + suffix
    except Exception:  # noqa: BLE001 - never let a redaction fail open
        return f"{base.partition('://')[0]}://***"


def _redact_rdb(text: str) -> str:
    from sqlalchemy.engine import make_url

    url = make_url(text)
    if "@" in (url.host or "") or "@" in (url.database or ""):
        return f"{url.drivername}://***"
    base = url.set(query={}).render_as_string(hide_password=True)
    if not url.query:
        return base
    pairs = []
    for key, values in url.query.items():
        for value in values if isinstance(values, tuple) else (values,):
            shown = "***" if key.lower() in ("password", "passwd", "pwd") else quote_plus(value, safe="/:")
            pairs.append(f"{quote_plus(key)}={shown}")
    return f"{base}?{'&'.join(pairs)}"


def redact_text(text: str, url: str) -> str:
    """`text` (an error message) with the password of `url` hidden wherever it appears in it,
    in any of the spellings it may take, and any URL in it redacted."""
    for secret in _passwords(url):
        if len(secret) >= 1:
            text = text.replace(secret, "***")
    return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)


def _passwords(url: str) -> list[str]:
    found: set[str] = set()
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.password:
            found.add(str(parsed.password))
        for key, values in parsed.query.items():
            if key.lower() in ("password", "passwd", "pwd"):
                found.update(values if isinstance(values, tuple) else (values,))
    except Exception:  # noqa: BLE001 - not a database URL: no password to hide
        pass
    for secret in list(found):
        found.update({quote(secret, safe=""), quote_plus(secret), unquote(secret)})
    return sorted((s for s in found if s), key=len, reverse=True)


def _shown_raw(text: Any, *, quote_it: bool = True) -> str:
    """Text that failed to parse as a storage, fit to show: cut at the last '@' before a host
    (user:secret@ hidden), the password= parameter hidden, and short."""
    text = str(text)
    head, at, tail = text.rpartition("@")
    if at:
        scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/*", head)
        text = (scheme.group(0) if scheme else "") + "***@" + tail
    text = re.sub(r"([?&](?:password|passwd|pwd)=)[^&]*", r"\1***", text, flags=re.IGNORECASE)
    if len(text) > 200:
        text = text[:197] + "..."
    return repr(text) if quote_it else text


def is_sqlite(url: str) -> bool:
    return parse_storage_url(url).kind == "sqlite"


def with_driver(url: str) -> str:
    """A plain postgresql:// URL with the driver that is installed. SQLAlchemy 2.1 reads a
    bare postgresql:// as psycopg (3), while autotune's `postgres` extra installs psycopg2."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        return url
    for module, driver in (("psycopg2", "psycopg2"), ("psycopg", "psycopg")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    return f"postgresql://{rest}"  # SQLAlchemy will say which module is missing


def split_ref(ref: str) -> tuple[str, str | None]:
    """'PATH.db#study' -> ('PATH.db', 'study'); a REF without '#NAME' -> (ref, None)."""
    base, sep, name = ref.rpartition("#")
    if sep and base and name:
        return base, name
    return ref, None
