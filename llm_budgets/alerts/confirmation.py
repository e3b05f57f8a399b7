"""The link that confirms an email address a tenant added to an alert endpoint (docs/alerts.md,
"Email addresses a tenant adds are confirmed first"): nothing is sent to the address until the
person who reads it follows the link, so a tenant cannot have the installation mail anyone.

The token is the endpoint's id and the address, signed with the project's ``SECRET_KEY``
(``django.core.signing``, a salt of its own) and timestamped: valid for
``ALERTS_EMAIL_CONFIRM_SECONDS`` (24 hours). It is not a secret from its reader (it names the
address it was sent to); nobody else can make one.
"""

from __future__ import annotations

from django.core import signing
from django.core.mail import send_mail

from llm_budgets.conf import conf

SALT = "llm_budgets.alerts.email_confirmation"


class ConfirmationInvalid(ValueError):
    """A confirmation link that is forged, cut short, expired, or no longer names an address
    of its endpoint. ``reason`` says which, for the person who followed it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def confirmation_token(endpoint_id: int, address: str) -> str:
    return signing.dumps({"endpoint": endpoint_id, "address": address}, salt=SALT)


def confirmation_read(token: str) -> tuple[int, str]:
    """The endpoint id and the address ``token`` confirms; ``ConfirmationInvalid`` otherwise."""
    hours = conf.ALERTS_EMAIL_CONFIRM_SECONDS / 3600
    try:
        data = signing.loads(token, salt=SALT, max_age=conf.ALERTS_EMAIL_CONFIRM_SECONDS)
    except signing.SignatureExpired:
        raise ConfirmationInvalid(
            f"This link has expired (links are valid {hours:g} hours). Ask whoever added your "
            "address for a new one: saving the endpoint's addresses again sends it."
        ) from None
    except signing.BadSignature:
        raise ConfirmationInvalid(
            "This link is not valid: it may have been cut short. Copy the whole link from the "
            "email, or ask for a new one."
        ) from None
    endpoint, address = (data or {}).get("endpoint"), (data or {}).get("address")
    if not isinstance(endpoint, int) or not isinstance(address, str):
        raise ConfirmationInvalid("This link is not valid.")
    return endpoint, address


def confirmation_send(*, link: str, address: str, owner: str, actor: str) -> None:
    """Email ``address`` the link that confirms it (raises what the mail backend raises)."""
    hours = conf.ALERTS_EMAIL_CONFIRM_SECONDS / 3600
    send_mail(
        "[llm_budgets] Confirm that this address receives budget alerts",
        f"{actor or owner} asked to send {owner}'s budget alerts to {address}.\n\n"
        f"Nothing is sent to this address until you confirm, here (valid {hours:g} hours):\n"
        f"{link}\n\n"
        "If you did not expect this, ignore this email: nothing will be sent to you.",
        conf.WARNING_FROM_EMAIL,
        [address],
    )
