"""The issuer key: read once at start from ``GPUSHARE_AUTH_ISSUER_SEED_FILE``."""

from __future__ import annotations

from pathlib import Path

from gpushare_common.settings import SettingsError

from .nkey import NkeyError, Signer, account_signer

VARIABLE = "GPUSHARE_AUTH_ISSUER_SEED_FILE"


def load_issuer(path: str) -> Signer:
    """The account key in file ``path``; :class:`SettingsError` names the variable and the fault."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise SettingsError(VARIABLE, path, f"a readable file with the issuer secret ({err.strerror})") from None
    try:
        return account_signer(text)
    except NkeyError as err:
        raise SettingsError(VARIABLE, path, f"a file with the issuer secret: {err}") from None
