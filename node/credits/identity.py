"""Who is asking: the one decision, for gRPC and HTTP alike, from a request's zoo-signature header.

No header: an anonymous client, or UNAUTHENTICATED when the node serves signed requests only. A header:
the signer, once the verifier accepts it; otherwise UNAUTHENTICATED saying why. A zoo-spend header beside
it is the signer's consent to be charged credits (consent.py), checked the same way. The client of the
request being handled is in the context variable CLIENT (set by the gRPC interceptor around the servicer).
"""

from __future__ import annotations

import dataclasses
from contextvars import ContextVar

from zoo.node.credits.consent import SpendCheck
from zoo.node.credits.signing import HEADER, SPEND_HEADER, SignatureError
from zoo.node.credits.verifier import ANONYMOUS, Client, RequestVerifier
from zoo.node.metrics import NodeMetrics

CLIENT: ContextVar[Client] = ContextVar("zoo_client", default=ANONYMOUS)


class Identify:
    """Decides which client sent a request (see the module docstring)."""

    def __init__(
        self,
        verifier: RequestVerifier,
        metrics: NodeMetrics,
        allow_anonymous: bool = True,
        spends: SpendCheck | None = None,
    ) -> None:
        """spends: checks zoo-spend headers (None: the node takes no credits; the header is refused)."""
        self.verifier = verifier
        self.metrics = metrics
        self.allow_anonymous = allow_anonymous
        self.spends = spends

    def __call__(self, header: str | None, method: str, body: bytes, spend: str | None = None) -> Client:
        """The client, or SignatureError (reason 'unsigned' when a signature is required)."""
        if spend is not None and header is None:
            self.metrics.signed_requests.labels("malformed").inc()
            raise SignatureError(
                "malformed", f"a {SPEND_HEADER} header needs a {HEADER} header: it is the signer's consent"
            )
        if header is None:
            if self.allow_anonymous:
                return ANONYMOUS
            self.metrics.signed_requests.labels("unsigned").inc()
            raise SignatureError(
                "unsigned",
                f"this node serves signed requests only: send a {HEADER} header signed for node "
                f"{self.verifier.node_address} (zoo.node.client signs for you)",
            )
        try:
            client = self.verifier.verify(header, method, body)
            if spend is not None:
                if self.spends is None:
                    raise SignatureError(
                        "malformed",
                        f"this node takes no credits (no UsageLedger): drop the {SPEND_HEADER} header",
                    )
                client = dataclasses.replace(client, spend=self.spends.check(spend, client.address))
        except SignatureError as e:
            self.metrics.signed_requests.labels(e.reason).inc()
            raise
        self.metrics.signed_requests.labels("accepted").inc()
        return client
