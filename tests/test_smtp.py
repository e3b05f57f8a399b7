"""The warning email through a real SMTP server on loopback (aiosmtpd): envelope, headers, both
bodies."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage
from typing import Any

import django
import pytest
from django.test import override_settings

from llm_budgets.jobs.thresholds import threshold_warning_send, thresholds_scan
from tests.factories import billing_contacts, reserve_30, seed
from tests.services import free_port, require

pytestmark = pytest.mark.django_db


class _Inbox:
    def __init__(self) -> None:
        self.envelopes: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.envelopes.append(envelope)
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp_server() -> Any:
    require("aiosmtpd", lambda: __import__("aiosmtpd.controller"))
    from aiosmtpd.controller import Controller

    inbox = _Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield inbox, controller.port
    finally:
        controller.stop()


def test_the_warning_goes_through_smtp_with_its_headers_and_bodies(smtp_server: Any) -> None:
    inbox, port = smtp_server
    seed(limit="100")
    billing_contacts("billing@acme.test\ncfo@acme.test")
    reserve_30()
    reserve_30()
    [crossing_id] = thresholds_scan()
    smtp = "django.core.mail.backends.smtp.EmailBackend"
    if django.VERSION >= (6, 1):
        mail_settings: dict[str, Any] = {
            "MAILERS": {
                "default": {"BACKEND": smtp, "OPTIONS": {"host": "127.0.0.1", "port": port}}
            }
        }
    else:
        mail_settings = {"EMAIL_BACKEND": smtp, "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": port}
    with override_settings(
        **mail_settings, LLM_BUDGETS={"WARNING_FROM_EMAIL": "budgets@saas.test"}
    ):
        assert threshold_warning_send(crossing_id) == "sent"
    [envelope] = inbox.envelopes
    assert envelope.mail_from == "budgets@saas.test"
    assert envelope.rcpt_tos == ["billing@acme.test", "cfo@acme.test"]
    message = email.message_from_bytes(envelope.content, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    assert message["Subject"] == "Acme: 50% of your month LLM budget used"
    assert message["From"] == "budgets@saas.test"
    assert message["To"] == "billing@acme.test, cfo@acme.test"
    assert message["Message-ID"] == f"<llm-budgets.warning.{crossing_id}@saas.test>"
    assert message.get_content_type() == "multipart/alternative"
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None
    assert html is not None
    assert "Remaining:  40.00 USD" in text.get_content()
    assert "<strong>50%</strong>" in html.get_content()
