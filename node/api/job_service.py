"""JobService: submit, inspect, watch and cancel learning jobs (admin-only; the interceptor checks the token).

Errors map to status codes through node/api/status_codes.py: a bad spec or id is INVALID_ARGUMENT, an unknown
job NOT_FOUND, cancelling a finished job FAILED_PRECONDITION, a full queue RESOURCE_EXHAUSTED and a GSPO job
on a node whose model is remote (no local weights to train) FAILED_PRECONDITION.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from zoo.node.jobs.runner import JobRunner
from zoo.node.jobs.store import TERMINAL, JobEvent, JobRecord, JobState
from zoo.registry.errors import ValidationError
from zoo.v1 import jobs_pb2, jobs_pb2_grpc

_STATES = {
    JobState.QUEUED: jobs_pb2.JOB_STATE_QUEUED,
    JobState.RUNNING: jobs_pb2.JOB_STATE_RUNNING,
    JobState.SUCCEEDED: jobs_pb2.JOB_STATE_SUCCEEDED,
    JobState.FAILED: jobs_pb2.JOB_STATE_FAILED,
    JobState.CANCELLED: jobs_pb2.JOB_STATE_CANCELLED,
}
WATCH_POLL_S = 1.0


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _struct(data: dict[str, Any] | None) -> Struct:
    s = Struct()
    if data:
        s.update(data)
    return s


def job_message(record: JobRecord, output_dir: str) -> jobs_pb2.Job:
    return jobs_pb2.Job(
        id=record.id,
        kind=record.kind,
        state=_STATES[record.state],
        spec=_struct(record.spec),
        created_at=_timestamp(record.created_at),
        updated_at=_timestamp(record.updated_at),
        error=record.error,
        step=record.step,
        result=_struct(record.result),
        output_dir=output_dir,
        cancel_requested=record.cancel_requested,
    )


def event_message(event: JobEvent) -> jobs_pb2.JobEvent:
    return jobs_pb2.JobEvent(
        job_id=event.job_id, seq=event.seq, type=event.type, data=_struct(event.data), at=_timestamp(event.at)
    )


class JobServicer(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, runner: JobRunner) -> None:
        self.runner = runner
        self.store = runner.store

    def _job(self, record: JobRecord) -> jobs_pb2.Job:
        return job_message(record, str(self.runner.jobs_dir / record.id))

    async def SubmitJob(self, request: jobs_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext) -> Any:
        if not request.kind:
            raise ValidationError("kind", "is required (e.g. 'tf-grpo')")
        spec = json_format.MessageToDict(request.spec)
        return self._job(self.runner.submit(request.kind, spec))

    async def GetJob(self, request: jobs_pb2.GetJobRequest, context: grpc.aio.ServicerContext) -> Any:
        return self._job(self.store.get(request.id))

    async def CancelJob(self, request: jobs_pb2.CancelJobRequest, context: grpc.aio.ServicerContext) -> Any:
        return self._job(self.runner.cancel(request.id))

    async def ListJobs(self, request: jobs_pb2.ListJobsRequest, context: grpc.aio.ServicerContext) -> Any:
        limit = request.limit or 50
        return jobs_pb2.ListJobsResponse(jobs=[self._job(r) for r in self.store.list(limit=limit)])

    async def WatchJob(
        self, request: jobs_pb2.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.JobEvent]:
        """Every event after `after_seq`, then new ones as they come, until the job ends."""
        after = request.after_seq
        self.store.get(request.id)  # NOT_FOUND / INVALID_ARGUMENT before the stream starts
        while True:
            state = self.store.get(request.id).state
            events = self.store.events(request.id, after_seq=after)
            for event in events:
                yield event_message(event)
                after = event.seq
            if state in TERMINAL and not events:
                return
            if not events:
                await self.runner.changed(request.id, WATCH_POLL_S)
