"""The host's user model as llm_budgets looks it up: no field name is assumed.

A host may swap ``AUTH_USER_MODEL`` for one without ``username`` (email login); lookups are
derived from the model's ``USERNAME_FIELD`` and ``EMAIL_FIELD`` instead.
"""

from __future__ import annotations

from django.core.exceptions import FieldDoesNotExist
from django.db import models


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
