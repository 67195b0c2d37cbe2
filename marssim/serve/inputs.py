"""A serving run's inputs from their two sources, flags and a deployment file, read once for every
verb that serves (``marssim serve``; ``search`` and ``compare`` with ``--model``).

* :func:`read_deployment_file`: the file's schema (``model``, ``system``, ``pools``, ``router``,
  ``decode_router``, ``context_bucket``, ``tp_comm``, ``requests``, ``slo``) as a
  :class:`DeploymentFile`;
* :func:`deployment_of`: the :class:`~.deployment.Deployment` of ``--pool`` settings or the file's
  pools, with the routing and timing settings that override the file's;
* :class:`RequestFlags` and :func:`request_spec`: the request stream (:class:`~.requests.RequestSpec`)
  from the flags, the file's ``requests`` section under them, every combination checked;
* :func:`request_seed`, :func:`constraints_of`, :func:`check_context`: the seed, the
  service-level objectives (:mod:`.slo`), and the model's context against the longest request.

Every problem is one :class:`~marssim.errors.InputError` naming the flag, or the file and key path.
Units: seconds, requests/s, tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from marssim.errors import InputError

from .deployment import Deployment, check_deployment, deployment_from_dict, parse_pool
from .requests import Arrivals, RequestSpec, closed_loop, parse_arrivals, parse_lengths, parse_prefix
from .slo import Constraints, parse_slo, slo_from_mapping

if TYPE_CHECKING:
    from marssim.workload.llm.config import TransformerConfig

__all__ = ["MAX_REQUESTS", "FILE_KEYS", "SETTING_KEYS", "REQUEST_KEYS", "DeploymentFile", "DeploymentFlags",
           "RequestFlags", "read_deployment_file", "deployment_of", "request_spec", "request_seed", "constraints_of",
           "check_context"]

MAX_REQUESTS = 10_000_000
"""The most requests of one run (each is drawn and simulated: thousands a second)."""
FILE_KEYS = ("model", "system", "pools", "router", "decode_router", "context_bucket", "tp_comm", "requests", "slo")
"""The keys of a deployment file."""
SETTING_KEYS = ("router", "decode_router", "context_bucket", "tp_comm")
"""The deployment's settings beside its pools (a flag of the same name overrides the file's)."""
REQUEST_KEYS = ("arrival", "prompt", "output", "count", "replay", "rate", "prefix", "seed", "concurrency", "duration")
"""The keys of a deployment file's ``requests`` section."""


@dataclass(frozen=True)
class DeploymentFile:
    """A deployment file's sections as read (``path`` None: no file, every section empty);
    ``data`` holds the raw top-level mapping, checked to have only :data:`FILE_KEYS`."""

    path: str | None = None
    data: dict = field(default_factory=dict)

    @property
    def model(self) -> str | None:
        value = self.data.get("model")
        return str(value) if value else None

    @property
    def system(self) -> str | None:
        value = self.data.get("system")
        return str(value) if value else None

    def requests(self) -> dict:
        """The ``requests`` section (empty when absent); InputError when it is no mapping or names
        an unknown key."""
        section = self.data.get("requests") or {}
        if not isinstance(section, dict):
            raise InputError(self.path, "requests", "expected a mapping (arrival, prompt, output, count, replay, "
                                                    "prefix, seed)")
        for key in section:
            if key not in REQUEST_KEYS:
                raise InputError(self.path, f"requests.{key}", f"unknown key; expected one of: "
                                                               f"{', '.join(REQUEST_KEYS)}")
        return section


def read_deployment_file(path: str | None) -> DeploymentFile:
    """The deployment file at ``path`` (None: none given); InputError for a file that is no mapping
    or has a key outside :data:`FILE_KEYS`."""
    if not path:
        return DeploymentFile()
    from marssim.schema import read_yaml

    data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError(path, "", "expected a mapping with pools (and model, system, router, requests, slo)")
    for key in data:
        if key not in FILE_KEYS:
            raise InputError(path, str(key), f"unknown key; expected one of: {', '.join(FILE_KEYS)}")
    return DeploymentFile(str(path), data)


@dataclass(frozen=True)
class DeploymentFlags:
    """The flags that make or change a deployment (None: not given): ``pools``, one ``--pool``
    settings string per pool; the settings of :data:`SETTING_KEYS`."""

    pools: tuple[str, ...] = ()
    router: str | None = None
    decode_router: str | None = None
    context_bucket: int | None = None
    tp_comm: str | None = None


def deployment_of(flags: DeploymentFlags, file: DeploymentFile = DeploymentFile()) -> Deployment:
    """The deployment of the ``--pool`` flags or else the file's pools (pools in both places are
    refused), the file's settings under the flags'; InputError naming the flag or key path."""
    data = file.data
    if flags.pools:
        pools = tuple(parse_pool(text, "--pool") for text in flags.pools)
        base = Deployment(pools)
        if data.get("pools") is not None:
            raise InputError(None, "--pool", f"{file.path} already lists pools; give them in one place")
        dep_data = {k: v for k, v in data.items() if k in SETTING_KEYS}
        if dep_data:
            base = deployment_from_dict({"pools": [{}], **dep_data}, file.path).with_(pools=pools)
    elif data.get("pools") is not None:
        base = deployment_from_dict({k: v for k, v in data.items() if k in ("pools",) + SETTING_KEYS}, file.path)
    else:
        raise InputError(None, "--pool", "give the replicas: --pool replicas=N,tp=T (repeatable) or --deployment FILE")
    changes = {k: getattr(flags, k) for k in SETTING_KEYS if getattr(flags, k) is not None}
    dep = base.with_(**changes) if changes else base
    check_deployment(dep, file.path or "--pool")
    if not dep.disaggregated and (flags.decode_router is not None or "decode_router" in data):
        where = (None, "--decode-router") if flags.decode_router is not None else (file.path, "decode_router")
        raise InputError(*where, "applies to disaggregated pools (role=prefill and role=decode); these pools "
                                 "prefill and decode on the same replicas")
    return dep


@dataclass(frozen=True)
class RequestFlags:
    """The request flags as given (None: not given): ``--replay``, ``--arrival``, ``--prompt``,
    ``--output``, ``--requests`` (``count``), ``--rate`` (requests/s), ``--prefix``,
    ``--concurrency`` (users) and ``--duration`` (s)."""

    replay: str | None = None
    arrival: str | None = None
    prompt: str | None = None
    output: str | None = None
    count: int | None = None
    rate: float | None = None
    prefix: str | None = None
    concurrency: int | None = None
    duration: float | None = None

    def flag(self, name: str) -> str:
        """How the user wrote the flag of field ``name``."""
        return "--requests" if name == "count" else f"--{name}"


def request_spec(flags: RequestFlags, file: DeploymentFile = DeploymentFile()) -> RequestSpec:
    """The request stream of the flags, each falling back on the file's ``requests`` section; every
    combination checked (a closed loop takes no rate, a replayed trace its own lengths, offline
    arrivals no rate). InputError naming the flag, or the file and key path."""
    section = file.requests()
    path = file.path

    def pick(name: str, key: str) -> tuple[Any, str]:
        value = getattr(flags, name)
        if value is not None:
            return value, flags.flag(name)
        return section.get(key), f"requests.{key}"

    replay, _ = pick("replay", "replay")
    arrival, arrival_where = pick("arrival", "arrival")
    prompt, prompt_where = pick("prompt", "prompt")
    output, output_where = pick("output", "output")
    count, _ = pick("count", "count")
    rate, _ = pick("rate", "rate")
    prefix, prefix_where = pick("prefix", "prefix")
    concurrency, concurrency_where = pick("concurrency", "concurrency")
    duration, duration_where = pick("duration", "duration")
    from .traces import load_trace

    try:
        if concurrency is not None or duration is not None:
            arrivals = _closed_loop(concurrency, concurrency_where, duration, duration_where, path,
                                    {"--replay": replay, "--arrival": arrival, "--rate": rate})
        elif replay:
            if arrival:
                raise InputError(None, "--arrival", "--replay takes the trace's arrivals; drop one of them")
            for given, where in ((prompt, prompt_where), (output, output_where)):
                if given is not None and not str(given).startswith("trace:"):
                    raise InputError(None, where, "--replay takes the trace's prompt and output lengths with its "
                                                  "arrivals; drop one of them (or give --arrival with --prompt "
                                                  "and --output)")
            load_trace(str(replay))
            arrivals = Arrivals("trace", trace=str(replay))
            prompt = prompt or f"trace:{replay}"
            output = output or f"trace:{replay}"
        elif arrival:
            arrivals = parse_arrivals(str(arrival), arrival_where)
            if arrivals.kind == "offline" and rate is not None:
                raise InputError(None, "--rate", "offline arrivals all come at time 0: a rate does nothing; drop "
                                                 "--rate, or give --arrival poisson:rate=R")
        elif rate is not None:
            arrivals = Arrivals("poisson", rate=float(rate))
        else:
            raise InputError(None, "--arrival", "give --replay TRACE, or --arrival (or --rate) with --prompt and "
                                                "--output")
        if prompt is None or output is None:
            raise InputError(None, "--prompt" if prompt is None else "--output",
                             "give the prompt and output lengths (e.g. --prompt uniform:128-2048 --output 256, or "
                             "trace:azure-conv-2023)")
        p = parse_lengths(prompt, prompt_where)
        o = parse_lengths(output, output_where)
    except InputError as err:
        if err.file is None and path and not any((flags.replay, flags.arrival, flags.prompt, flags.output)):
            raise InputError(path, problems=err.problems) from None
        raise
    if count is None:
        count = len(load_trace(arrivals.trace)) if arrivals.kind == "trace" else \
            max(1000, arrivals.concurrency) if arrivals.kind == "closed" and not arrivals.duration else 1000
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_REQUESTS:
        where = (None, "--requests") if flags.count is not None else (path, "requests.count")
        raise InputError(*where, f"expected a number of requests from 1 to {MAX_REQUESTS:,} (a simulation serves "
                                 f"thousands of requests a second), got {count!r}")
    spec = RequestSpec(arrivals, p, o, int(count))
    if prefix:
        tokens, groups, share = parse_prefix(str(prefix), prefix_where)
        spec = replace(spec, prefix_tokens=tokens, prefix_groups=groups, prefix_share=share)
    if rate is not None and (arrivals.kind == "trace" or arrival):
        spec = spec.with_rate(float(rate))
    return spec


def _closed_loop(concurrency: Any, concurrency_where: str, duration: Any, duration_where: str, file: str | None,
                 others: dict[str, Any]) -> Arrivals:
    """The closed loop's arrivals from ``--concurrency``/``--duration`` (or the file's
    ``requests.concurrency``/``requests.duration``)."""
    from marssim import units

    def where(key_where: str) -> tuple[str | None, str]:
        return (None, key_where) if key_where.startswith("--") else (file, key_where)

    if concurrency is None:
        raise InputError(*where(duration_where), "a duration bounds a closed loop; give --concurrency N too")
    for flag, value in others.items():
        if value:
            raise InputError(None, flag, "a closed loop (--concurrency) sends each request when a user's previous "
                                         "one ends; drop " + flag + " (lengths: --prompt and --output)")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(*where(concurrency_where), f"expected a positive integer (users), got {concurrency!r}")
    seconds = 0.0
    if duration is not None:
        try:
            seconds = duration if isinstance(duration, float) else units.parse(duration, "time", require_unit=True,
                                                                               bounded=True)
        except units.UnitError as err:
            raise InputError(*where(duration_where), str(err)) from None
        if not seconds > 0:
            raise InputError(*where(duration_where), f"expected a positive time, got {duration!r}")
    return closed_loop(concurrency, seconds)


def request_seed(seed: int | None, file: DeploymentFile = DeploymentFile()) -> int:
    """The seed of the requests and the random router: ``seed`` (``--seed``), else the file's
    ``requests.seed``, else 0."""
    if seed is not None:
        return seed
    value = (file.data.get("requests") or {}).get("seed", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InputError(file.path, "requests.seed", f"expected an integer from 0 to 2^63-1, got {value!r}")
    return value


def constraints_of(slo: str | None, file: DeploymentFile = DeploymentFile()) -> Constraints:
    """The file's ``slo`` section with ``--slo``'s bounds (``slo``) over it, one grammar
    (:mod:`.slo`)."""
    section = file.data.get("slo")
    constraints = slo_from_mapping(section, file.path) if section is not None else Constraints()
    return constraints.overridden_by(parse_slo(slo)) if slo is not None else constraints


def check_context(model: TransformerConfig, spec: RequestSpec, seed: int) -> None:
    """InputError when a request of ``spec`` (drawn with ``seed``; its prompt, shared prefix and
    output tokens together) is longer than ``model``'s context (``max_positions``), which no
    engine serves (vLLM refuses such a prompt unless ``--max-model-len`` truncates it)."""
    import numpy as np

    requests = spec.draw(seed)
    total = requests.prompt + requests.output
    over = np.flatnonzero(total > model.max_positions)
    if len(over):
        i = int(over[np.argmax(total[over])])
        where = "--replay" if spec.arrivals.kind == "trace" and spec.prompt.kind == "trace" else "--prompt"
        raise InputError(None, where, f"{len(over):,} of {len(total):,} requests need more tokens than the model's "
                                      f"context of {model.max_positions:,} (the longest: prompt "
                                      f"{int(requests.prompt[i]):,} + output {int(requests.output[i]):,}); give "
                                      "shorter --prompt and --output lengths, or a model with a longer context "
                                      "(max_positions=)")

