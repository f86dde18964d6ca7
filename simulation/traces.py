"""Workload traces read into TraceJob values: what each job asked for, when it arrived and how long it ran.

Three formats:

- swf: the Standard Workload Format of the Parallel Workloads Archive (18 whitespace-separated numbers a
  line, `;` header and comment lines, -1 for unknown). One pod per job asking for its processors as cpu.
- philly: Microsoft's Philly GPU trace as a CSV `timestamp,duration,num_gpus,gpu_time,cluster`, rows in
  any order; a job of G GPUs is ceil(G/8) pods on 8-GPU nodes; its virtual cluster is its queue.
- sluice: job files as `sluice submit` reads them, each document with two more top-level keys: `submitAt`
  (when it arrives) and `runFor` (how long it runs), both durations ('90s', '2m') or seconds. A document may
  wait as a submitted job does: `spec.startAfter` (a duration after its submitAt only: a replay has no
  calendar), `spec.dependsOn` (a document's name, or a job number: the trace's jobs are numbered 1.. as one
  submit of the file numbers them, an array's elements in index order and the array by its first element),
  and `spec.array` (the document becomes `count` jobs, each with its runFor, at most `parallelism` at once).

SWF's fields 17 and 18 (preceding job, think time) become a dependency: the job waits until its preceding
job has finished, then the think time (dependencies=False ignores them, and a Sluice file's dependsOn). A
dependency on a job that is not replayed (dropped, or outside the window) is left out: it is taken to have
ended before the replay began.

Times are seconds from the first usable job's submit (so the first job arrives at 0). Amounts are Sluice
milli-units (sluice.quantity): 4 cpus is {"cpu": 4000}, 8 GPUs {"nvidia.com/gpu": 8000}.
"""
from __future__ import annotations

import bisect
import gc
import gzip
import math
import os
import zlib
from csv import reader as csv_reader
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from dispatcher.policy.holding import cycle_in
from sluice import _validate
from sluice._validate import NAME
from sluice.documents import parse_numbered_documents
from sluice.quantity import add
from sluice.spec import JobSpec, SpecError, job_from_document

__all__ = ["TraceJob", "TraceDependency", "TraceArray", "Trace", "TraceError", "read_trace", "FORMATS", "GPU", "CPU",
           "PHILLY_GPUS_PER_NODE"]

FORMATS = ("swf", "philly", "sluice")
CPU = "cpu"
GPU = "nvidia.com/gpu"
PHILLY_GPUS_PER_NODE = 8  # Philly's servers had 8 GPUs (Jeon et al., ATC'19): a bigger job spans servers
_SUFFIX_FORMATS = {".swf": "swf", ".csv": "philly", ".yaml": "sluice", ".yml": "sluice", ".json": "sluice"}
_SWF_FIELDS = (
    "job number", "submit time", "wait time", "run time", "allocated processors", "average cpu time",
    "used memory", "requested processors", "requested time", "requested memory", "status", "user id",
    "group id", "executable number", "queue number", "partition number", "preceding job", "think time",
)
_PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
MAX_SECONDS = 10 ** 10  # about 317 years: no workload's time or span is longer (and a replay's clock would overflow)
MAX_COUNT = 10 ** 9  # processors or GPUs of one job: more than any machine has
_SWF_TIMES = (1, 3, 8, 17)  # the fields that are seconds: submit, run, requested and think time
_EPOCH = datetime(1970, 1, 1)


class TraceError(Exception):
    """A trace that cannot be read. line: the 1-based line of the file at fault (None when the fault is not
    one line); document: the 1-based document of a Sluice job file at fault."""

    def __init__(self, message: str, *, line: int | None = None, document: int | None = None):
        super().__init__(message)
        self.line = line
        self.document = document


@dataclass(frozen=True, slots=True)
class TraceDependency:
    """The job may start only once `on` has done `condition` (holding.CONDITIONS), and think_s after that."""

    on: tuple[int, ...]  # trace job ids: one job, or every element of an array (those replayed)
    condition: str = "finished"
    think_s: float = 0.0  # SWF's think time: seconds after the preceding job ends
    label: int = 0  # how reasons name it: the job's id, an array's first element's
    array: bool = False


@dataclass(frozen=True, slots=True)
class TraceArray:
    """The job is an element of an array: at most `parallelism` of its elements queued or running at once,
    taken in index order."""

    id: int  # the trace id of its first element
    index: int
    parallelism: int | None


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: int  # swf: the job number; philly: the row's line in the file; sluice: the document number
    submit_s: float  # seconds after the trace's first submit
    run_s: float  # how long it ran once started
    requested_s: float | None  # the run-time limit it asked for; None when the trace does not say
    pods: tuple[tuple[int, dict[str, int]], ...]  # (count, per-pod requests in milli-units)
    user: str  # '' when the trace does not say
    group: str  # '' when the trace does not say
    queue: str
    partition: str  # '' when the trace does not say
    name: str
    spec: JobSpec | None = field(default=None, compare=False, repr=False)  # sluice format: the job as written
    start_after_s: float | None = None  # it waits until this long after its submit (startAfter)
    depends_on: tuple[TraceDependency, ...] = ()
    array: TraceArray | None = None

    @property
    def waits(self) -> bool:
        """Whether it may wait before it is queued: for a time, other jobs or a slot of its array."""
        return bool(self.start_after_s) or bool(self.depends_on) or (
            self.array is not None and self.array.parallelism is not None)

    @property
    def requests(self) -> dict[str, int]:
        """Milli-units the whole job needs at once."""
        total: dict[str, int] = {}
        for count, requests in self.pods:
            total = add(total, requests, count)
        return total


@dataclass(frozen=True)
class Trace:
    name: str  # the file's name without its format and .gz suffixes
    format: str  # one of FORMATS
    jobs: tuple[TraceJob, ...]  # sorted by (submit_s, id)
    skipped: int  # bad lines (documents, for the sluice format) skipped under skip_bad_lines
    dropped: int  # well-formed records of jobs that never ran (run time or size <= 0), dropped as the literature does
    machine: dict[str, int] | None  # the machine's size when the trace says it (SWF MaxProcs, else MaxNodes, as cpu)
    lines: int  # lines in the file (documents, for the sluice format)
    usable_jobs: int = 0  # jobs in the whole file after dropping, before the window
    window: tuple[int, int] | None = None  # (start, count) as asked of read_trace


# -- reading ----------------------------------------------------------------------------------------

def read_trace(path: str | os.PathLike, fmt: str | None = None, *, skip_bad_lines: bool = False,
               window: tuple[int, int] | None = None, dependencies: bool = True) -> Trace:
    """Read a trace file (gzip-compressed or not). fmt: one of FORMATS, or None to tell from the file name.
    skip_bad_lines: count malformed lines in Trace.skipped instead of raising TraceError at the first.
    window=(start, count): only the jobs start..start+count-1 in submit order (after dropping), re-based so
    the first of them arrives at 0; fewer when the trace ends sooner. dependencies: replay SWF's preceding
    jobs and a Sluice file's dependsOn (False: every job is independent; a dependsOn is still checked)."""
    path = Path(path)
    fmt = _format(path, fmt)
    start, count = _window(window)
    text = _read_text(path)
    source = path.name
    collecting = gc.isenabled()
    gc.disable()  # hundreds of thousands of acyclic records: the cycle collector would take a third of the time
    try:
        if fmt == "swf":
            records, skipped, dropped, machine = _swf_records(text, source, skip_bad_lines, dependencies)
        elif fmt == "philly":
            records, skipped, dropped = _philly_records(text, source, skip_bad_lines)
            machine = None
        else:
            records, skipped, documents = _sluice_records(text, source, skip_bad_lines)
            dropped, machine = 0, None
        lines = _count_lines(text) if fmt != "sluice" else documents
        records.sort(key=_submit_order)
        usable = len(records)
        if window is not None:
            if start >= usable:
                raise TraceError(f"{source}: the window starts at job {start}, but the trace has {usable} usable "
                                 f"jobs (numbered from 0)")
            records = records[start:start + count]
        origin = records[0][0] if records else 0.0
        jobs = tuple(_BUILDERS[fmt](record, origin) for record in records)
        if fmt != "philly":
            jobs = _replayed_dependencies(jobs, dependencies)
    finally:
        if collecting:
            gc.enable()
    return Trace(name=_trace_name(path), format=fmt, jobs=jobs, skipped=skipped, dropped=dropped, machine=machine,
                 lines=lines, usable_jobs=usable, window=None if window is None else (start, count))


def _replayed_dependencies(jobs: tuple[TraceJob, ...], keep: bool) -> tuple[TraceJob, ...]:
    """The jobs with their dependencies on replayed jobs only (none unless keep): a job that is not replayed
    (dropped, or outside the window) is taken to have ended before the replay began."""
    if not any(job.depends_on for job in jobs):
        return jobs
    present = {job.id for job in jobs}
    out = []
    for job in jobs:
        if job.depends_on:
            kept = []
            for dependency in job.depends_on if keep else ():
                on = tuple(i for i in dependency.on if i in present)
                if on:
                    kept.append(dependency if len(on) == len(dependency.on) else replace(dependency, on=on))
            job = replace(job, depends_on=tuple(kept))
        out.append(job)
    return tuple(out)


def _submit_order(record: tuple) -> tuple[float, int]:
    return record[0], record[1]


def _format(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise TraceError(f"unknown trace format {fmt!r}: expected one of {', '.join(FORMATS)}")
        return fmt
    name = path.name.lower().removesuffix(".gz")
    guessed = _SUFFIX_FORMATS.get(os.path.splitext(name)[1])
    if guessed is None:
        raise TraceError(f"{path.name}: cannot tell the trace format from the file name (.swf, .csv, .yaml, .yml "
                         f"or .json, optionally .gz); give it with --format {'|'.join(FORMATS)}")
    return guessed


def _window(window: tuple[int, int] | None) -> tuple[int, int]:
    if window is None:
        return 0, 0
    try:
        start, count = window
    except (TypeError, ValueError):
        raise TraceError(f"window must be (start, count), got {window!r}") from None
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise TraceError(f"window start must be a whole number of jobs, 0 or more, got {start!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TraceError(f"window count must be a whole number of jobs, 1 or more, got {count!r}")
    return start, count


def _trace_name(path: Path) -> str:
    name = path.name.removesuffix(".gz").removesuffix(".GZ")
    stem, ext = os.path.splitext(name)
    return stem if ext.lower() in _SUFFIX_FORMATS else name


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a trace file") from None
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror or err}") from None
    if data[:2] == b"\x1f\x8b":  # gzip's magic number: decompress whatever the name says
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise TraceError(f"{path.name}: not a readable gzip file ({err})") from None
    # utf-8-sig: a byte order mark, as spreadsheets write one before a CSV's header, is not part of the text.
    return data.decode("utf-8-sig", errors="replace")  # a stray byte then shows in the error for its line


def _too_long(text: str, since: str = "") -> str:
    return f"more than {MAX_SECONDS:,} seconds (about 300 years){since}: {text!r}"


def _count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


class _BadLines:
    """Raises TraceError for a bad line, or counts it when bad lines are skipped."""

    def __init__(self, source: str, skip: bool):
        self.source, self.skip, self.count = source, skip, 0

    def __call__(self, line: int, message: str) -> None:
        if not self.skip:
            raise TraceError(f"{self.source} line {line}: {message}", line=line)
        self.count += 1


# -- Standard Workload Format ---------------------------------------------------------------------------

# record: (submit, id, run, requested or None, processors, user, group, queue, partition, line, preceding job or
# -1, think time)

def _swf_records(text: str, source: str, skip: bool,
                 dependencies: bool = True) -> tuple[list[tuple], int, int, dict[str, int] | None]:
    bad = _BadLines(source, skip)
    records: list[tuple] = []
    dropped = 0
    header: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), 1):
        fields = line.split()
        if not fields:
            continue
        if fields[0].startswith(";"):
            _swf_header(line, header)
            continue
        if len(fields) != 18:
            bad(number, f"expected 18 fields, found {len(fields)}")
            continue
        try:
            values = [float(f) for f in fields]
        except ValueError:
            index, value = next((i, f) for i, f in enumerate(fields) if not _is_number(f))
            bad(number, f"field {index + 1} ({_SWF_FIELDS[index]}) is not a number: {value!r}")
            continue
        total = sum(values)
        # A nan or inf in any field poisons the sum (so do finite fields too large to add, which the checks
        # below refuse or drop by their own rules).
        if (total != total or math.isinf(total)) and \
                (index := next((i for i, x in enumerate(values) if not math.isfinite(x)), None)) is not None:
            bad(number, f"field {index + 1} ({_SWF_FIELDS[index]}) is not a finite number: {fields[index]!r}")
            continue
        if (index := next((i for i in _SWF_TIMES if values[i] > MAX_SECONDS), None)) is not None:
            bad(number, f"field {index + 1} ({_SWF_FIELDS[index]}) is {_too_long(fields[index])}")
            continue
        submit, run, processors = values[1], values[3], values[4]
        if processors == -1:
            processors = values[7]
        if processors != int(processors) or processors > MAX_COUNT:
            index = 4 if values[4] != -1 else 7
            what = "not a whole number" if processors != int(processors) else f"more than {MAX_COUNT:,}"
            bad(number, f"field {index + 1} ({_SWF_FIELDS[index]}) is {what}: {fields[index]!r}")
            continue
        # Cancelled before they started (run time or size <= 0, or unknown): not load, so the literature drops
        # them; a submit time of -1 (unknown) leaves nothing to replay.
        if run <= 0 or processors <= 0 or submit < 0:
            dropped += 1
            continue
        requested = values[8]
        preceding = int(values[16]) if values[16] > 0 and dependencies else -1
        records.append((submit, int(values[0]), run, requested if requested > 0 else None, int(processors),
                        int(values[11]), int(values[12]), int(values[14]), int(values[15]), number, preceding,
                        max(values[17], 0.0)))
    if any(record[10] != -1 for record in records):
        _swf_cycle(records, source)
    machine_size = header.get("MaxProcs") or header.get("MaxNodes")
    machine = {CPU: machine_size * 1000} if machine_size else None
    return records, bad.count, dropped, machine


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _swf_header(line: str, header: dict[str, int]) -> None:
    key, sep, value = line.lstrip().lstrip(";").partition(":")
    key = key.strip()
    if sep and key in ("MaxProcs", "MaxNodes"):
        try:
            size = int(value.split()[0])
        except (ValueError, IndexError):
            return  # a header line is information, not data: one that does not parse just tells us nothing
        if size > 0:
            header[key] = size


def _swf_cycle(records: list[tuple], source: str) -> None:
    """Refuse preceding jobs that go round in a circle: none of them could ever start."""
    lines = {record[1]: record[9] for record in records}
    graph = {record[1]: [record[10]] for record in records if record[10] in lines}
    cycle = cycle_in(graph)
    if cycle is not None:
        raise TraceError(f"{source} line {lines[cycle[0]]}: the preceding jobs (field 17) form a cycle: "
                         + " -> ".join(f"job {job}" for job in cycle), line=lines[cycle[0]])


def _swf_job(record: tuple, origin: float) -> TraceJob:
    submit, job_id, run, requested, processors, user, group, queue, partition, _line, preceding, think = record
    return TraceJob(
        id=job_id, submit_s=submit - origin, run_s=run, requested_s=requested,
        pods=((1, {CPU: processors * 1000}),),
        user=f"u{user}" if user >= 0 else "", group=f"g{group}" if group >= 0 else "",
        queue=f"q{queue}" if queue >= 0 else "default", partition=f"p{partition}" if partition >= 0 else "",
        name=f"job-{job_id}",
        depends_on=(TraceDependency((preceding,), "finished", think, preceding),) if preceding != -1 else (),
    )


# -- Philly CSV --------------------------------------------------------------------------------------

# record: (submit, line, duration, gpus, cluster)

def _philly_records(text: str, source: str, skip: bool) -> tuple[list[tuple], int, int]:
    bad = _BadLines(source, skip)
    lines = text.split("\n")
    rows = csv_reader(lines)
    columns: dict[str, int] | None = None
    width = 0
    records: list[tuple] = []
    dropped = 0
    timestamps: dict[str, float] = {}
    for number, row in enumerate(rows, 1):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if columns is None:
            names = [name.strip() for name in row]
            missing = [name for name in _PHILLY_COLUMNS if name not in names]
            if missing:
                raise TraceError(f"{source} line {number}: the header must name the columns "
                                 f"{', '.join(_PHILLY_COLUMNS)}; missing {', '.join(missing)} "
                                 f"(found {','.join(names)})", line=number)
            columns, width = {name: names.index(name) for name in _PHILLY_COLUMNS}, len(names)
            continue
        if len(row) != width:
            bad(number, f"expected {width} columns, found {len(row)}")
            continue
        stamp = row[columns["timestamp"]].strip()
        submit = timestamps.get(stamp)
        if submit is None:
            submit = _philly_time(stamp)
            if submit is None:
                bad(number, f"timestamp is neither seconds nor a date and time such as '2017-10-09 07:01:55': "
                            f"{stamp!r}")
                continue
            if abs(submit) > MAX_SECONDS:
                bad(number, f"timestamp is {_too_long(stamp, ' from 1970')}")
                continue
            timestamps[stamp] = submit
        duration_text, gpus_text = row[columns["duration"]].strip(), row[columns["num_gpus"]].strip()
        try:
            duration = float(duration_text)
        except ValueError:
            bad(number, f"duration is not a number: {duration_text!r}")
            continue
        try:
            gpus = float(gpus_text)
        except ValueError:
            bad(number, f"num_gpus is not a number: {gpus_text!r}")
            continue
        if not math.isfinite(duration):
            bad(number, f"duration is not a finite number: {duration_text!r}")
            continue
        if duration > MAX_SECONDS:
            bad(number, f"duration is {_too_long(duration_text)}")
            continue
        if not math.isfinite(gpus) or gpus < 0 or gpus != int(gpus):
            bad(number, f"num_gpus is not a whole number of GPUs, 0 or more: {gpus_text!r}")
            continue
        if gpus > MAX_COUNT:
            bad(number, f"num_gpus is more than {MAX_COUNT:,}: {gpus_text!r}")
            continue
        cluster = row[columns["cluster"]].strip()
        if not NAME.match(cluster):
            bad(number, f"cluster {cluster!r} cannot be a Sluice queue name (lower-case letters, digits, '-', "
                        f"'_' and '.')")
            continue
        # The published trace has no 0-GPU rows, but other cuts of the Philly log list CPU-only jobs: with no
        # GPU to place they are not load on a GPU cluster, so they are dropped like SWF's empty jobs.
        if duration <= 0 or gpus == 0:
            dropped += 1
            continue
        records.append((submit, number, duration, int(gpus), cluster))
    if columns is None:
        raise TraceError(f"{source}: empty: expected a header line {','.join(_PHILLY_COLUMNS)} and rows")
    return records, bad.count, dropped


def _philly_time(text: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
        if moment.tzinfo is not None:
            moment = moment.replace(tzinfo=None) - moment.utcoffset()
        return (moment - _EPOCH).total_seconds()  # naive times are read as UTC: only differences matter
    return seconds if math.isfinite(seconds) else None


def _philly_job(record: tuple, origin: float) -> TraceJob:
    submit, line, duration, gpus, cluster = record
    full, rest = divmod(gpus, PHILLY_GPUS_PER_NODE)
    pods: tuple[tuple[int, dict[str, int]], ...] = ()
    if full:
        pods += ((full, {GPU: PHILLY_GPUS_PER_NODE * 1000}),)
    if rest:
        pods += ((1, {GPU: rest * 1000}),)
    return TraceJob(id=line, submit_s=submit - origin, run_s=duration, requested_s=None, pods=pods, user="",
                    group="", queue=cluster, partition="", name=f"job-{line}")


# -- Sluice job files --------------------------------------------------------------------------------

# record: (submit, job id, run, spec, start after or None, dependencies, array element or None, name)

@dataclass(frozen=True)
class _Document:
    number: int  # its place in the file, 1-based
    first: int  # the trace id of its (first) job
    submit_s: float
    run_s: float
    start_after_s: float | None
    spec: JobSpec

    @property
    def count(self) -> int:
        return self.spec.array.count if self.spec.array is not None else 1

    def label(self) -> str:
        return f"document {self.number}" + (f" ({self.spec.name})" if self.spec.name else "")


def _sluice_records(text: str, source: str, skip: bool) -> tuple[list[tuple], int, int]:
    """The records of a job file, its skipped documents and how many documents it has."""
    try:
        documents = parse_numbered_documents(text, source=source)
    except SpecError as err:
        raise TraceError(str(err), document=err.document) from None
    read: list[_Document] = []
    skipped = 0
    first = 1
    last = 0
    for number, document in documents:
        first += number - last - 1  # an empty document keeps its number: without arrays a job's id is its document's
        last = number
        try:
            doc = _sluice_document(number, first, document, source)
        except TraceError:
            if not skip:
                raise
            skipped += 1
            first += 1  # as one job: the numbers after it stay what the file says
            continue
        read.append(doc)
        first += doc.count
    while True:
        edges, bad = _resolved(read, source)
        if bad is None:
            break
        if not skip:
            raise bad
        read = [doc for doc in read if doc.number != bad.document]  # and what depends on it, next round
        skipped += 1
    by_number = {doc.number: doc for doc in read}
    cycle = cycle_in({n: sorted({on.number for on, _, _ in doc_edges}) for n, doc_edges in edges.items()})
    if cycle is not None:
        raise TraceError(f"{source}: the dependencies form a cycle: "
                         + " -> ".join(by_number[n].label() for n in cycle), document=cycle[0])
    records = []
    for doc in read:
        dependencies = tuple(_dependency(on, element, condition)
                             for on, element, condition in edges.get(doc.number, ()))
        spec, array = doc.spec, doc.spec.array
        for k in range(doc.count):
            element = None if array is None else TraceArray(doc.first, array.first + k, array.parallelism)
            name = spec.name or f"job-{doc.first}"
            records.append((doc.submit_s, doc.first + k, doc.run_s, spec, doc.start_after_s, dependencies, element,
                            name if element is None else f"{name}[{element.index}]"))
    return records, skipped, len(documents)


def _sluice_document(number: int, first: int, document: dict, source: str) -> _Document:
    where = f"{source} document {number}"
    document = dict(document)  # the two replay keys come out; the rest is the job as `sluice submit` reads it
    times = {}
    for key in ("submitAt", "runFor"):
        if document.get(key) is None:
            raise TraceError(f"{where}: {key}: required for a replayed job (a duration such as '90s' or '2m', "
                             f"or seconds)", document=number)
        try:
            times[key] = _validate.duration(document.pop(key), key)  # finite: JSON's NaN and Infinity refused
        except SpecError as err:
            raise TraceError(f"{where}: {err}", document=number) from None
        if times[key] > MAX_SECONDS:
            raise TraceError(f"{where}: {key}: {_too_long(f'{times[key]:g}s')}", document=number)
    if times["runFor"] <= 0:
        raise TraceError(f"{where}: runFor: must be more than 0s", document=number)
    try:
        spec = job_from_document(document, document=number, source=source, owned=True)
    except SpecError as err:
        raise TraceError(str(err), document=number) from None
    if isinstance(spec.start_after, datetime):
        raise TraceError(f"{where}: spec.startAfter: {spec.start_after.isoformat().replace('+00:00', 'Z')} is a time, "
                         f"but a replay has no calendar: give a duration after submitAt (e.g. 30m)", document=number)
    if spec.start_after and spec.start_after > MAX_SECONDS:
        raise TraceError(f"{where}: spec.startAfter: {_too_long(f'{spec.start_after:g}s')}", document=number)
    return _Document(number, first, times["submitAt"], times["runFor"], spec.start_after or None, spec)


def _resolved(read: list[_Document], source: str) -> tuple[dict[int, list[tuple]], TraceError | None]:
    """Per document number, its dependencies as (document, element index or None: all of it, condition); or
    the first dependency that names no replayed job, as the error to raise."""
    named: dict[str, list[_Document]] = {}
    starts = sorted((doc.first, doc) for doc in read)
    for doc in read:
        if doc.spec.name is not None:
            named.setdefault(doc.spec.name, []).append(doc)
    edges: dict[int, list[tuple]] = {}
    for doc in read:
        for k, dependency in enumerate(doc.spec.depends_on):
            where = f"{source} document {doc.number}: spec.dependsOn[{k}].job"
            job = dependency.job
            if isinstance(job, str):
                found = named.get(job, [])
                if len(found) != 1:
                    why = (f"{len(found)} documents are named {job!r} ("
                           + ", ".join(str(d.number) for d in found) + "): name each once, or give a job number"
                           if found else f"no document of the trace is named {job!r}")
                    return edges, TraceError(f"{where}: {why}", document=doc.number)
                edges.setdefault(doc.number, []).append((found[0], None, dependency.condition))
                continue
            at = bisect.bisect_right(starts, job, key=lambda s: s[0]) - 1
            target = starts[at][1] if at >= 0 else None
            if target is None or job >= target.first + target.count:
                return edges, TraceError(f"{where}: no job numbered {job} in the trace (its jobs are numbered "
                                         f"1.. in document order, an array's elements one each)", document=doc.number)
            element = None if job == target.first else job - target.first
            edges.setdefault(doc.number, []).append((target, element, dependency.condition))
    return edges, None


def _dependency(on: _Document, element: int | None, condition: str) -> TraceDependency:
    if element is not None:
        return TraceDependency((on.first + element,), condition, 0.0, on.first + element)
    return TraceDependency(tuple(range(on.first, on.first + on.count)), condition, 0.0, on.first,
                           on.spec.array is not None)


def _sluice_job(record: tuple, origin: float) -> TraceJob:
    submit, job_id, run, spec, start_after, dependencies, element, name = record
    pods = tuple((pod_set.count, dict(pod_set.requests)) for pod_set in spec.pod_sets)
    return TraceJob(id=job_id, submit_s=submit - origin, run_s=run, requested_s=spec.max_runtime_s, pods=pods,
                    user="", group="", queue=spec.queue, partition="", name=name, spec=spec,
                    start_after_s=start_after, depends_on=dependencies, array=element)


_BUILDERS = {"swf": _swf_job, "philly": _philly_job, "sluice": _sluice_job}
