"""Where a message enters the worker: the checks that decide whether it may run.

The consumer asks ``Admission.check`` about every delivery before it reads any header for
its own use. The checks are the ones the worker's main process can make without decoding
the body: every header it reads, by type and range (``protocol.validate_headers``), the
content type and properties, the body's size against this worker's own
``max_message_size`` (a producer may have had a higher one), the content type against
``accept_content``, and the task's name against the registry. With signing on it also
checks a signed body's signature, the one look inside a body (decompressed first when its
``compression`` header says so: what was signed is the uncompressed envelope). A refused
message goes to the dead-letter store with the reason; where it carries a usable id, its
result becomes ``FAILURE`` with an exception that says why, so a caller waiting in
``get()`` learns at once instead of at its timeout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import (
    ContentDisallowed,
    DecodeError,
    MessageTooLarge,
    NotRegistered,
    SecurityError,
)
from ..protocol import Message, valid_id, validate_headers, validate_properties
from ..serialization import accepted_content_types, compression, signing

if TYPE_CHECKING:
    from ..app import Celeriac


class Refusal(NamedTuple):
    reason: str
    """For the dead letter and the log line."""
    error: Exception
    """What ``AsyncResult.get()`` raises for it."""


class Admission:
    def __init__(self, app: Celeriac) -> None:
        settings = app.settings
        self.tasks = app.tasks
        self.max_size = settings.max_message_size
        self.accept = accepted_content_types(settings.accept_content)
        self.signed = signing.checked_at_entry(settings.accept_content)
        """Signing is on (``accept_content=["auth"]``): a body's signature is checked here,
        before the worker does anything with the message, and only here (the process
        running the task opens it unchecked: ``signing.open_admitted``)."""

    def check(self, message: Message) -> Refusal | None:
        """Why ``message`` may not run here, or None if it may."""
        kept = message.kept
        reason = validate_headers(message.headers if kept is None else kept[0]) \
            or validate_properties(message)
        if reason is not None:
            reason = f"malformed message: {reason}"
            return Refusal(reason, DecodeError(reason))
        size = len(message.body)
        if size > self.max_size:
            reason = (f"message body is {size} bytes, over this worker's "
                      f"max_message_size={self.max_size}")
            return Refusal(reason, MessageTooLarge(reason))
        if message.content_type not in self.accept:
            if self.signed:
                reason = (f"unsigned message (content type {message.content_type!r}): this "
                          "worker accepts signed messages only (accept_content=['auth'])")
                return Refusal(reason, SecurityError(reason))
            reason = (f"content type {message.content_type!r} is not accepted "
                      f"(accept_content: {sorted(self.accept)})")
            return Refusal(reason, ContentDisallowed(reason))
        if self.signed and message.content_type == signing.CONTENT_TYPE:
            refusal = self._verify(message)
            if refusal is not None:
                return refusal
        name = message.headers["task"]
        if name not in self.tasks:
            return Refusal(f"unknown task {name!r}", NotRegistered(name))
        return None

    def _verify(self, message: Message) -> Refusal | None:
        body = message.body
        packed = message.headers.get(compression.HEADER)
        if packed is not None:
            # The auth serializer signs the serialized body and kombu (or our producer)
            # compresses the signed envelope after it, as the ``compression`` header
            # says: the signature is over the decompressed bytes. Decompressed within
            # max_message_size, as the child does (a small bomb must not blow up the
            # main process); its name was checked with the headers above.
            try:
                body = compression.decompress(body, packed, self.max_size)
            except DecodeError as exc:
                reason = f"malformed message: cannot decompress its signed body: {exc}"
                return Refusal(reason, DecodeError(reason))
        verifier = signing.current()
        try:
            if verifier is None:
                raise SecurityError("this worker cannot check signatures: its app did not "
                                    "call app.setup_security()")
            verifier.verify(body)
        except SecurityError as exc:
            reason = f"signature check failed: {exc}"
            return Refusal(reason, SecurityError(reason))
        return None


def result_id(headers: Any) -> str | None:
    """The id under which to store a refused message's failure, if it has a usable one
    and its producer wants a result."""
    if not isinstance(headers, dict) or headers.get("ignore_result") is True:
        return None
    task_id: Any = headers.get("id")
    return task_id if valid_id(task_id) and task_id.isprintable() else None
