"""The host's users as llm_budgets sees them: how one is looked up, and which end user it is.

A host may swap ``AUTH_USER_MODEL`` for one without ``username`` (email login): lookups are
derived from the model's ``USERNAME_FIELD`` and ``EMAIL_FIELD``, never a fixed field name. Which
end user of the ledger a host user is follows one setting, ``END_USER_ID``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.utils.module_loading import import_string

from llm_budgets.exceptions import InvalidUsage


def user_lookup_fields(user_model: type[models.Model]) -> list[str]:
    """The user model's fields that identify a user, for admin search and commands: its
    ``USERNAME_FIELD`` and, when the model has that field too, its ``EMAIL_FIELD``."""
    names = [str(getattr(user_model, "USERNAME_FIELD", "username"))]
    email = getattr(user_model, "EMAIL_FIELD", None)
    if email and email not in names:
        try:
            user_model._meta.get_field(email)
        except FieldDoesNotExist:
            pass  # AbstractBaseUser names EMAIL_FIELD = "email" without having the field
        else:
            names.append(str(email))
    return names


def user_pk(user: Any) -> str:
    """The default ``END_USER_ID``: the user's primary key as a string (no personal data)."""
    return str(user.pk)


def user_username(user: Any) -> str:
    """The pages' rule before ``END_USER_ID`` existed: ``get_username()`` (the email on
    email-login hosts, which then lands in ledger lines, exports and logs). For hosts whose
    ledger already records usage under it."""
    return str(user.get_username())


def end_user_id(user: Any) -> str:
    """The end user external id of a host user, by ``LLM_BUDGETS["END_USER_ID"]``: the one rule
    the pages and the Django integration helper share. A value the ledger refuses raises
    ``InvalidUsage`` naming the setting."""
    from llm_budgets.conf import conf
    from llm_budgets.validation import identifier

    mapped = import_string(conf.END_USER_ID)(user)
    try:
        return identifier("end_user", mapped)
    except InvalidUsage as exc:
        raise InvalidUsage(
            f"LLM_BUDGETS['END_USER_ID'] ({conf.END_USER_ID}) gave {mapped!r} for user "
            f"pk={user.pk!r}: {exc.message}",
            field="end_user",
        ) from None
