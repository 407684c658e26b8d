"""Hard caps for shares from the vendor's own partitioning, described as data.

A vendor resource's ``isolation`` entry (in the runtime's vendor table,
``vendors.<resource>.isolation`` of runtime.json) says what every share of one
card receives: environment variables and bind mounts, computed from the
share's numbers::

    "isolation": "none"                       soft share: nothing is capped
    "isolation": {
      "name": "mps",
      "env": {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0={card_memory_mib * k / n}M",
              "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "{percent}"},
      "mounts": [{"source": "{shadow_dir}/pipe", "destination": "/tmp/nvidia-mps"}]
    }

A template is text with ``{expression}`` fields (``{{`` and ``}}`` are literal
braces).  An expression is integer arithmetic (``+ - *``, ``/`` rounding down,
parentheses) over the share's numbers, or one text variable alone:

- ``n``: the ShadowPod's share spec, shares per card;
- ``k``: how many of that card's shares the container holds;
- ``card_memory_mib``: the card's memory in MiB (known when Allocate was told it);
- ``percent``: the compute share in percent, the pod's ``compute-percentage``
  annotation (at most its share) or else ``100 * k / n`` rounded down;
- ``shadow_dir`` (text): the ShadowPod's host directory,
  ``<isolation_dir>/<namespace>_<pod>``.

Mounts are bind mounts (``options`` default ``rbind, rw, nosuid, nodev``); their
``destination`` is a fixed absolute path.  The caps reach a container only
through Allocate's signed ``container-devices-isolation`` annotation, whose
value :func:`format_share_caps` writes and :func:`parse_share_caps` reads.

Standard library only and cheap to import: the runtime loads it on a capped create.
"""

from __future__ import annotations

from .ids import IdError, check_resource_name, json_loads, parse_pod_key

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: the runtime avoids importing typing
if TYPE_CHECKING:
    from typing import Any

SOFT_SHARE = "none"
SOFT_SHARE_LABEL = "soft share"
MPS = "mps"  # the profile whose ShadowPods run NVIDIA's MPS control daemon
NUMBERS = frozenset({"n", "k", "card_memory_mib", "percent"})
TEXTS = frozenset({"shadow_dir"})
DEFAULT_MOUNT_OPTIONS = ("rbind", "rw", "nosuid", "nodev")
MPS_PIPE_DIR = "/tmp/nvidia-mps"  # MPS's default, so that clients find it without the variable
MPS_LOG_DIR = "/var/log/nvidia-mps"
SHM_DIR = "/dev/shm"
# NVIDIA MPS: the ShadowPod runs the control daemon on <shadow_dir>/{pipe,log,shm}; each share
# talks to it through the same directories and the same /dev/shm (the MPS server and its
# clients exchange data through shared memory there, so a pod's private /dev/shm would not do).
NVIDIA_MPS: dict[str, object] = {
    "name": MPS,
    "env": {
        "CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE_DIR,
        "CUDA_MPS_LOG_DIRECTORY": MPS_LOG_DIR,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0={card_memory_mib * k / n}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "{percent}",
    },
    "mounts": [
        {"source": "{shadow_dir}/pipe", "destination": MPS_PIPE_DIR},
        {"source": "{shadow_dir}/log", "destination": MPS_LOG_DIR},
        {"source": "{shadow_dir}/shm", "destination": SHM_DIR},
    ],
}
_OPERATORS = "+-*/()"
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_CHARS = _NAME_START | frozenset("0123456789")


class IsolationError(ValueError):
    """Bad isolation input: which file or annotation, which field, why."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        self.source = source
        self.field = field
        self.reason = reason
        super().__init__(f"{source}: {field}: {reason}" if field else f"{source}: {reason}")


# --- templates --------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    found: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == " ":
            index += 1
        elif char in _OPERATORS:
            found.append(char)
            index += 1
        elif char in _NAME_CHARS:
            end = index
            while end < len(text) and text[end] in _NAME_CHARS:
                end += 1
            found.append(text[index:end])
            index = end
        else:
            raise ValueError(f"unexpected {char!r} in {{{text}}}")
    return found


class _Expression:
    """Recursive descent over the tokens of one ``{...}`` field; nodes are tuples."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.index = 0

    def parse(self) -> tuple[Any, ...]:
        if not self.tokens:
            raise ValueError("empty {}")
        if len(self.tokens) == 1 and self.tokens[0] in TEXTS:
            return ("text", self.tokens[0])
        node = self.sum()
        if self.index < len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.index]!r} in {{{self.text}}}")
        return node

    def take(self) -> str:
        if self.index >= len(self.tokens):
            raise ValueError(f"{{{self.text}}} ends too early")
        self.index += 1
        return self.tokens[self.index - 1]

    def sum(self) -> tuple[Any, ...]:
        node = self.product()
        while self.index < len(self.tokens) and self.tokens[self.index] in "+-":
            node = ("op", self.take(), node, self.product())
        return node

    def product(self) -> tuple[Any, ...]:
        node = self.atom()
        while self.index < len(self.tokens) and self.tokens[self.index] in "*/":
            node = ("op", self.take(), node, self.atom())
        return node

    def atom(self) -> tuple[Any, ...]:
        token = self.take()
        if token == "(":
            node = self.sum()
            if self.take() != ")":
                raise ValueError(f"missing ')' in {{{self.text}}}")
            return node
        if token.isdigit() and token.isascii():
            return ("int", int(token))
        if token in NUMBERS:
            return ("var", token)
        if token in TEXTS:
            raise ValueError(f"{token} is text: it can only stand alone in {{}}")
        raise ValueError(f"unknown variable {token!r} (known: {', '.join(sorted(NUMBERS | TEXTS))})")


Template = tuple[object, ...]  # literal strings and expression nodes


def compile_template(text: str) -> Template:
    """Parse a template; ValueError says what is wrong with it."""
    parts: list[object] = []
    literal: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char in "{}" and text[index + 1 : index + 2] == char:
            literal.append(char)
            index += 2
        elif char == "}":
            raise ValueError("a single '}' (write '}}' for a literal one)")
        elif char == "{":
            end = text.find("}", index)
            if end < 0:
                raise ValueError("'{' without its '}'")
            parts += ["".join(literal), _Expression(text[index + 1 : end]).parse()]
            literal = []
            index = end + 1
        else:
            literal.append(char)
            index += 1
    parts.append("".join(literal))
    return tuple(p for p in parts if p != "")


def _evaluate(node: tuple[Any, ...], values: dict[str, int | str | None]) -> int | str:
    kind = node[0]
    if kind == "int":
        return int(node[1])
    if kind in ("var", "text"):
        value = values.get(node[1])
        if value is None:
            raise ValueError(f"{node[1]} is not known for this share")
        return value
    left, right = _evaluate(node[2], values), _evaluate(node[3], values)
    if not isinstance(left, int) or not isinstance(right, int):
        raise ValueError("text in arithmetic")
    if node[1] == "/" and right == 0:
        raise ValueError("division by zero")
    result = {"+": left + right, "-": left - right, "*": left * right}.get(node[1])
    return left // right if result is None else result


def render(template: Template, values: dict[str, int | str | None]) -> str:
    """The template's text for these values; ValueError when a value is missing or bad."""
    out = []
    for part in template:
        if isinstance(part, str):
            out.append(part)
            continue
        value = _evaluate(part, values)  # type: ignore[arg-type]
        if isinstance(value, int) and value < 0:
            raise ValueError(f"negative result {value}")
        out.append(str(value))
    return "".join(out)


# --- the vendor table's isolation entry --------------------------------------


class MountTemplate:
    __slots__ = ("destination", "options", "source", "type")

    def __init__(self, source: Template, destination: str, options: tuple[str, ...],
                 kind: str) -> None:
        self.source = source
        self.destination = destination
        self.options = options
        self.type = kind


class Isolation:
    """One vendor's isolation profile; ``name`` ``none`` is the soft share."""

    __slots__ = ("env", "mounts", "name")

    def __init__(self, name: str, env: tuple[tuple[str, Template], ...] = (),
                 mounts: tuple[MountTemplate, ...] = ()) -> None:
        self.name = name
        self.env = env
        self.mounts = mounts

    @property
    def soft(self) -> bool:
        return self.name == SOFT_SHARE

    @property
    def label(self) -> str:
        """How /status and the README show it."""
        return SOFT_SHARE_LABEL if self.soft else self.name


NO_ISOLATION = Isolation(SOFT_SHARE)


def _is_name(value: object) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= 128 and value[0] in _NAME_START
            and all(c in _NAME_CHARS for c in value))


def is_profile_name(value: object) -> bool:
    """A valid isolation profile name: letters, digits and ``_``, not ``none`` (the soft share)."""
    return _is_name(value) and value != SOFT_SHARE


def _template(source: str, field: str, text: object) -> Template:
    if not isinstance(text, str):
        raise IsolationError(source, field, "expected a template string")
    if "\0" in text:
        raise IsolationError(source, field, "NUL in template")
    try:
        return compile_template(text)
    except ValueError as err:
        raise IsolationError(source, field, str(err)) from None


def _absolute(value: object) -> bool:
    return (isinstance(value, str) and value.startswith("/") and "\0" not in value
            and all(p not in (".", "..") for p in value.split("/")))


def _mount(source: str, field: str, doc: object) -> MountTemplate:
    if not isinstance(doc, dict):
        raise IsolationError(source, field, "expected an object {source, destination, options?}")
    unknown = set(doc) - {"source", "destination", "options", "type"}
    if unknown:
        raise IsolationError(source, field, f"unknown keys {sorted(unknown)}")
    if not _absolute(doc.get("destination")):
        raise IsolationError(source, f"{field}.destination", "expected an absolute path without . or ..")
    options = doc.get("options", list(DEFAULT_MOUNT_OPTIONS))
    if not isinstance(options, list) or not all(isinstance(o, str) and o for o in options):
        raise IsolationError(source, f"{field}.options", "expected a list of mount options")
    if not {"bind", "rbind"} & set(options):
        raise IsolationError(source, f"{field}.options", "isolation mounts are bind mounts: "
                             "include bind or rbind")
    kind = doc.get("type", "bind")
    if kind != "bind":
        raise IsolationError(source, f"{field}.type", "only bind mounts are supported")
    return MountTemplate(_template(source, f"{field}.source", doc.get("source")),
                         doc["destination"], tuple(options), kind)


def parse_isolation(source: str, field: str, doc: object) -> Isolation:
    """A vendor's ``isolation`` entry; IsolationError names ``source`` (the file) and the field."""
    if doc == SOFT_SHARE:
        return NO_ISOLATION
    if not isinstance(doc, dict):
        raise IsolationError(source, field, f"expected {SOFT_SHARE!r} or an object {{name, env, mounts}}")
    unknown = set(doc) - {"name", "env", "mounts"}
    if unknown:
        raise IsolationError(source, field, f"unknown keys {sorted(unknown)}")
    name = doc.get("name")
    if not _is_name(name) or name == SOFT_SHARE:
        raise IsolationError(source, f"{field}.name", f"expected a name of letters, digits and _ "
                             f"(not {SOFT_SHARE!r}), got {name!r}")
    env = doc.get("env", {})
    if not isinstance(env, dict):
        raise IsolationError(source, f"{field}.env", "expected an object {VARIABLE: template}")
    for variable in env:
        if not _is_name(variable):
            raise IsolationError(source, f"{field}.env", f"bad variable name {variable!r}")
    mounts = doc.get("mounts", [])
    if not isinstance(mounts, list):
        raise IsolationError(source, f"{field}.mounts", "expected a list of mounts")
    return Isolation(
        str(name),
        tuple((k, _template(source, f"{field}.env.{k}", v)) for k, v in env.items()),
        tuple(_mount(source, f"{field}.mounts[{i}]", m) for i, m in enumerate(mounts)),
    )


# --- the signed share caps (Allocate -> runtime) -----------------------------


class ShareCaps:
    """What Allocate knows of a capped share and signs: the ShadowPod, N, the card."""

    __slots__ = ("card_memory_mib", "k", "n", "opt_out", "profile", "resource", "shadow")

    def __init__(self, profile: str, resource: str, shadow: str, n: int, k: int,
                 card_memory_mib: int | None = None, opt_out: bool = False) -> None:
        self.profile = profile
        self.resource = resource
        self.shadow = shadow
        self.n = n
        self.k = k
        self.card_memory_mib = card_memory_mib
        self.opt_out = opt_out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShareCaps) and self._doc() == other._doc()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._doc().items())))

    def _doc(self) -> dict[str, object]:
        doc = {name: getattr(self, name) for name in self.__slots__}
        return {k: v for k, v in doc.items() if v is not None}

    @property
    def share_percent(self) -> int:
        return 100 * self.k // self.n


def format_share_caps(caps: ShareCaps) -> str:
    """Compact JSON, keys sorted (what Allocate signs)."""
    import json

    return json.dumps(caps._doc(), sort_keys=True, separators=(",", ":"))


def _int(annotation: str, doc: dict[str, Any], key: str, low: int, high: int) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise IsolationError(annotation, key, f"expected an integer in [{low}, {high}], got {value!r}")
    return value


def parse_share_caps(annotation: str, value: str) -> ShareCaps:
    """The value of a ``container-devices-isolation`` annotation; IsolationError if malformed."""
    try:
        doc = json_loads(value)
    except ValueError as err:
        raise IsolationError(annotation, "", f"malformed JSON: {err}") from None
    if not isinstance(doc, dict):
        raise IsolationError(annotation, "", "expected a JSON object")
    unknown = set(doc) - set(ShareCaps.__slots__)
    if unknown:
        raise IsolationError(annotation, "", f"unknown keys {sorted(unknown)}")
    profile = doc.get("profile")
    if not _is_name(profile) or profile == SOFT_SHARE:
        raise IsolationError(annotation, "profile", f"expected an isolation name, got {profile!r}")
    try:
        resource = check_resource_name(doc.get("resource"))
        shadow = "/".join(parse_pod_key(doc.get("shadow")))
    except IdError as err:
        raise IsolationError(annotation, err.what, err.reason) from None
    n = _int(annotation, doc, "n", 1, 1024)
    memory = doc.get("card_memory_mib")
    if not isinstance(doc.get("opt_out", False), bool):
        raise IsolationError(annotation, "opt_out", "expected true or false")
    return ShareCaps(str(profile), resource, shadow, n, _int(annotation, doc, "k", 1, n),
                     None if memory is None else _int(annotation, doc, "card_memory_mib", 1, 1 << 30),
                     bool(doc.get("opt_out", False)))


# --- computing what a share gets ---------------------------------------------


def shadow_dir(root: str, shadow: str) -> str:
    """``<root>/<namespace>_<pod>``: neither name can hold ``_`` or ``/``, so it is unique."""
    namespace, pod = parse_pod_key(shadow)
    return f"{root.rstrip('/')}/{namespace}_{pod}"


def compute_percent(caps: ShareCaps, requested: object, where: str) -> int:
    """The pod's requested compute share, bounded by its share; its share when none asked."""
    if requested is None:
        return max(caps.share_percent, 1)
    text = requested.strip() if isinstance(requested, str) else ""
    if not (text.isdigit() and text.isascii() and 1 <= int(text) <= caps.share_percent):
        raise IsolationError(where, "", f"expected an integer percentage in [1, {caps.share_percent}] "
                             f"(its share: {caps.k} of {caps.n}), got {requested!r}")
    return int(text)


class ShareEdits:
    """The environment variables and bind mounts one capped share receives."""

    __slots__ = ("env", "mounts")

    def __init__(self, env: dict[str, str], mounts: list[dict[str, Any]]) -> None:
        self.env = env
        self.mounts = mounts


def share_values(caps: ShareCaps, root: str, percent: int) -> dict[str, int | str | None]:
    return {"n": caps.n, "k": caps.k, "card_memory_mib": caps.card_memory_mib,
            "percent": percent, "shadow_dir": shadow_dir(root, caps.shadow)}


def compute(isolation: Isolation, values: dict[str, int | str | None], where: str) -> ShareEdits:
    """Render ``isolation`` for one share; IsolationError names the field it cannot compute."""
    env, mounts, field = {}, [], ""
    try:
        for name, template in isolation.env:
            field = f"env.{name}"
            env[name] = render(template, values)
        for index, mount in enumerate(isolation.mounts):
            field = f"mounts[{index}].source"
            source = render(mount.source, values)
            if not _absolute(source):
                raise ValueError(f"{source!r} is not an absolute path without . or ..")
            mounts.append({"destination": mount.destination, "type": mount.type,
                           "source": source, "options": list(mount.options)})
    except ValueError as err:
        raise IsolationError(where, f"isolation {isolation.name!r} {field}",
                             f"cannot compute the caps: {err}") from None
    return ShareEdits(env, mounts)
