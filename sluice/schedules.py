"""The Schedule document (a recurring job, as a Kubernetes CronJob) as a frozen value (docs/api.md).

`sluice schedule create -f` reads one with load_schedule(); the dispatcher reads what it is sent with
schedule_from_document(). Validation is as strict as for job files (sluice.spec): unknown fields are
errors and every error is one SpecError naming the field ('spec.schedule', 'spec.jobTemplate.spec.queue').
The cron expression is checked by cronsim (see docs/api.md for why that library), the time zone by zoneinfo.
to_document() writes the canonical form back, and schedule_from_document() reads it to an equal value.
"""
from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import datetime

from cronsim import CronSim, CronSimError

from sluice import _validate as v
from sluice._validate import SpecError
from sluice.documents import parse_numbered_documents
from sluice.quantity import format_duration_exact
from sluice.spec import API_VERSION, JobSpec, job_from_document

__all__ = ["ScheduleSpec", "schedule_from_document", "load_schedule", "cron_expression", "time_zone",
           "CONCURRENCY_POLICIES", "SCHEDULE_LABEL"]

KIND = "Schedule"
CONCURRENCY_POLICIES = ("Allow", "Forbid", "Replace")
SCHEDULE_LABEL = "sluice.io/schedule"  # on every job a schedule starts: the schedule's name
MAX_HISTORY = 100  # successfulJobsHistoryLimit and failedJobsHistoryLimit, each at most
# The macros Vixie cron knows, as the 5-field expressions they stand for (cronsim takes fields only).
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
          "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_TOP_FIELDS = ("apiVersion", "kind", "metadata", "spec")
_SPEC_FIELDS = ("schedule", "timeZone", "concurrencyPolicy", "startingDeadline", "suspend",
                "successfulJobsHistoryLimit", "failedJobsHistoryLimit", "jobTemplate")


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    schedule: str  # the cron expression as given (a macro stays a macro); cron is its 5 fields
    cron: str
    time_zone: str = "UTC"  # an IANA name
    concurrency_policy: str = "Allow"  # Allow | Forbid | Replace
    starting_deadline_s: float | None = None  # a due time missed by more than this is skipped; None: never
    suspend: bool = False
    successful_jobs_history_limit: int = 3
    failed_jobs_history_limit: int = 1
    template: JobSpec | None = None  # the job each run submits, without its name

    def to_document(self) -> dict:
        job = self.template.to_document()
        spec: dict = {"schedule": self.schedule, "timeZone": self.time_zone,
                      "concurrencyPolicy": self.concurrency_policy}
        if self.starting_deadline_s is not None:
            spec["startingDeadline"] = format_duration_exact(self.starting_deadline_s)
        spec.update({"suspend": self.suspend, "successfulJobsHistoryLimit": self.successful_jobs_history_limit,
                     "failedJobsHistoryLimit": self.failed_jobs_history_limit,
                     "jobTemplate": {"metadata": {"labels": job["metadata"]["labels"]}, "spec": job["spec"]}})
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": self.name}, "spec": spec}

    def job_document(self, name: str) -> dict:
        """The Job document of one run: the template, named `name`, labelled with this schedule's name."""
        doc = self.template.to_document()
        doc["metadata"] = {"name": name, "labels": {**doc["metadata"]["labels"], SCHEDULE_LABEL: self.name}}
        return doc

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.time_zone)


def cron_expression(value: object, path: str) -> str:
    """A 5-field cron expression (or one of MACROS) as its 5 fields, checked by cronsim."""
    text = v.string(value, path, max_len=200)
    fields = MACROS.get(text.strip().lower(), text).split()
    if len(fields) != 5:
        raise SpecError(path, f"invalid cron expression {text!r}: expected 5 fields (minute hour day-of-month "
                              f"month day-of-week) or one of {', '.join(MACROS)}, got {len(fields)}")
    cron = " ".join(fields)
    try:
        CronSim(cron, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise SpecError(path, f"invalid cron expression {text!r}: {exc}") from None
    except (ValueError, IndexError, KeyError) as exc:  # cronsim words most errors; not every odd token
        raise SpecError(path, f"invalid cron expression {text!r}: {exc or type(exc).__name__}") from None
    return cron


def time_zone(value: object, path: str) -> str:
    """An IANA time zone name that zoneinfo knows ('Europe/Berlin', 'UTC')."""
    text = v.string(value, path, max_len=100)
    try:
        zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise SpecError(path, f"unknown time zone {text!r} (an IANA name such as 'Europe/Berlin' or 'UTC')") \
            from None
    return text


def schedule_from_document(doc: object, *, document: int | None = None, source: str | None = None) -> ScheduleSpec:
    with v.located(document, source):
        doc = v.mapping(doc, "")
        if doc.get("apiVersion") != API_VERSION:
            raise SpecError("apiVersion", f"must be {API_VERSION}, got {v.describe(doc.get('apiVersion'))}")
        if doc.get("kind") != KIND:
            raise SpecError("kind", f"must be {KIND}, got {v.describe(doc.get('kind'))}")
        v.check_fields(doc, _TOP_FIELDS, "")
        metadata = v.mapping(doc.get("metadata"), "metadata", allowed=("name",), required=True)
        name = v.dns_label(v.required(metadata, "name", "metadata"), "metadata.name")
        spec = v.mapping(doc.get("spec"), "spec", allowed=_SPEC_FIELDS, required=True)
        schedule = v.string(v.required(spec, "schedule", "spec"), "spec.schedule")
        cron = cron_expression(schedule, "spec.schedule")
        deadline = v.optional(v.duration, spec.get("startingDeadline"), "spec.startingDeadline", positive=True)
        return ScheduleSpec(
            name=name, schedule=schedule.strip(), cron=cron,
            time_zone=time_zone(v.get(spec, "timeZone", "UTC"), "spec.timeZone"),
            concurrency_policy=v.choice(v.get(spec, "concurrencyPolicy", "Allow"), "spec.concurrencyPolicy",
                                        CONCURRENCY_POLICIES),
            starting_deadline_s=deadline,
            suspend=v.boolean(v.get(spec, "suspend", False), "spec.suspend"),
            successful_jobs_history_limit=v.integer(v.get(spec, "successfulJobsHistoryLimit", 3),
                                                    "spec.successfulJobsHistoryLimit", 0, MAX_HISTORY),
            failed_jobs_history_limit=v.integer(v.get(spec, "failedJobsHistoryLimit", 1),
                                                "spec.failedJobsHistoryLimit", 0, MAX_HISTORY),
            template=_template(spec.get("jobTemplate")))


def _template(value: object) -> JobSpec:
    path = "spec.jobTemplate"
    template = v.mapping(value, path, allowed=("metadata", "spec"), required=True)
    metadata = v.mapping(template.get("metadata"), f"{path}.metadata", allowed=("labels",))
    try:
        job = job_from_document({"apiVersion": API_VERSION, "kind": "Job", "metadata": metadata,
                                 "spec": template.get("spec")})
    except SpecError as exc:
        raise SpecError(f"{path}.{exc.path}" if exc.path else path, exc.message) from None
    if SCHEDULE_LABEL in job.labels:
        raise SpecError(f"{path}.metadata.labels.{SCHEDULE_LABEL}", "set by Sluice on every run: leave it out")
    return job


def load_schedule(text: str, *, source: str = "<input>") -> ScheduleSpec:
    """The one Schedule document of a file."""
    docs = list(parse_numbered_documents(text, source=source))
    if len(docs) != 1:
        raise SpecError("", f"expected one Schedule document, found {len(docs)}", source=source)
    _, doc = docs[0]
    return schedule_from_document(doc, source=source)
