"""Hiding secrets on the pages: a job's command, tune file and variables are shown with secret values masked.

What counts as a secret: a variable or parameter whose name starts with CRED or holds a word such
as PASSWORD, TOKEN or KEY, and any value that reads like a key (a PEM block, a long random-looking
string) unless it is a hex identifier under a name saying so (`--run_id=<uuid>`). The stored job keeps
its real values; only what is displayed is masked.
"""

import math
import re
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MASK = "******"

SECRET_NAME_WORDS = {
    "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASS", "TOKEN", "KEY", "APIKEY", "ACCESSKEY", "SECRETKEY",
    "CREDENTIAL", "CREDENTIALS", "AUTH", "PRIVATE", "SK", "AK", "SIGNATURE", "COOKIE", "SESSION",
}
# Long runs of key-like characters holding both letters and digits (access keys, tokens, hashes).
KEY_LIKE_VALUE = re.compile(r"^(?=.*[A-Za-z])(?=.*\d)[A-Za-z0-9+/=_\-.]{32,}$")
HEX = re.compile(r"[0-9a-fA-F]+")
# An identifier written in hex, dashes allowed: a UUID with or without its dashes, a run or trace id.
HEX_IDENTIFIER = re.compile(r"[0-9a-fA-F]+(?:-[0-9a-fA-F]+)*")
# Words of a name saying its value is an identifier (run_id, --job-id, RUN_UUID, runId), not key material.
IDENTIFIER_NAME_WORDS = {"ID", "IDS", "UUID", "GUID", "RUNID", "JOBID", "TRIALID", "TRACEID"}
SECRET_VALUE_PREFIXES = ("-----BEGIN", "ghp_", "github_pat_", "xox", "sk-", "AKIA")
# One shell word as shlex.join writes it: unquoted runs, '…' and "…" pieces, glued together.
SHELL_WORD = re.compile(r"""(?:[^\s'"\\]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.)+""")
ASSIGNMENT = re.compile(r"^(-{0,2})([A-Za-z_][A-Za-z0-9_-]*)=(.*)$", re.DOTALL)


def secret_name(name: str) -> bool:
    upper = name.upper()
    if upper.startswith("CRED"):
        return True
    return any(word in SECRET_NAME_WORDS for word in re.split(r"[_\-.]+", upper))


def name_words(name: str) -> list[str]:
    """The words of a name, split at separators and at camelCase humps (runId gives RUN and ID)."""
    return re.split(r"[_\-.]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).upper())


def hex_identifier(name: str, value: str) -> bool:
    """Whether the value is a hex identifier (a UUID, a run id) under a name saying it is one.

    Such a value reads as random as a hex key, so only its name tells it apart: `--run_id=<uuid hex>` is
    shown, the same hex under any other name is still taken for a key.
    """
    return bool(HEX_IDENTIFIER.fullmatch(value.strip())) and any(
        word in IDENTIFIER_NAME_WORDS for word in name_words(name))


def secret_value(value: str) -> bool:
    text = value.strip()
    if text.startswith(SECRET_VALUE_PREFIXES):
        return True
    if not KEY_LIKE_VALUE.match(text) or text.startswith(("/", "./", "../", "~")):
        return False
    return random_looking(text)


def random_looking(text: str) -> bool:
    """Whether a long value reads like random key material rather than words (a path, a host list, a run name).

    Random base64 or alphanumerics carry about 5 bits a character; names made of words, numbers and
    separators stay near 4 or under. Hex digests, 4 bits at most, are taken as keys when long enough.
    """
    counts = Counter(text)
    entropy = -sum(count / len(text) * math.log2(count / len(text)) for count in counts.values())
    if HEX.fullmatch(text):
        return len(text) >= 32 and entropy >= 3.0
    return entropy >= 4.4


def looks_secret(name: str, value: str) -> bool:
    return secret_name(name) or (secret_value(value) and not hex_identifier(name, value))


def masked(name: str, value: str) -> str:
    return MASK if value and looks_secret(name, value) else value


def mask_shell_text(text: str) -> str:
    """Mask the value of every `NAME=value` / `--name=value` word that looks secret, leaving the rest as written."""

    def replace(match: re.Match) -> str:
        word = match.group(0)
        try:
            parts = shlex.split(word)
        except ValueError:
            return word
        if len(parts) != 1:
            return word
        assignment = ASSIGNMENT.match(parts[0])
        if not assignment:
            return word
        dashes, name, value = assignment.groups()
        if not value or not looks_secret(name, value):
            return word
        return shlex.quote(f"{dashes}{name}=") + MASK

    return "\n".join(SHELL_WORD.sub(replace, line) for line in text.split("\n"))


@dataclass(frozen=True)
class ShownVariable:
    name: str
    value: str
    is_masked: bool


def shown_variables(names: Iterable[str], values: Mapping[str, str]) -> list[ShownVariable]:
    shown = []
    for name in names:
        value = values.get(name, "")
        hidden = masked(name, value)
        shown.append(ShownVariable(name=name, value=hidden, is_masked=hidden != value))
    return shown


def tune_file_names(tune_file: str) -> list[str]:
    """The variable names of a tune file of `-x NAME` lines (a `-x NAME=value` line gives NAME)."""
    names = []
    for line in tune_file.splitlines():
        words = line.split(None, 1)
        if len(words) == 2 and words[0] == "-x":
            names.append(words[1].split("=", 1)[0].strip())
    return names
