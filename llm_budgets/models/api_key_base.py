"""The base of ``ApiKey``: djangorestframework-api-key's ``AbstractAPIKey``.

That package's ``models`` module also declares the app's own concrete ``APIKey``, which Django
refuses to load unless ``rest_framework_api_key`` is in ``INSTALLED_APPS``: imported from a host
that lacks the app, it stopped every ``manage.py`` command with a traceback before the system
checks could say what is missing. Without the app, a stand-in with the same fields (held equal by
``tests/test_host_setup.py``) lets Django start, and check ``llm_budgets.E092`` names the app to
add; nothing that uses keys works until it is added (the stand-in has none of the key methods).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import apps

if TYPE_CHECKING or apps.is_installed("rest_framework_api_key"):
    from rest_framework_api_key.models import AbstractAPIKey
else:
    from django.db import models
    from django.utils.translation import gettext_lazy as _

    class AbstractAPIKey(models.Model):
        """djangorestframework-api-key 3.x's fields and options, without its manager or methods:
        only so that the models load and ``manage.py check`` can report E092."""

        id = models.CharField(max_length=150, unique=True, primary_key=True, editable=False)
        prefix = models.CharField(max_length=8, unique=True, editable=False)
        hashed_key = models.CharField(max_length=150, editable=False)
        created = models.DateTimeField(auto_now_add=True, db_index=True)
        name = models.CharField(
            max_length=50,
            blank=False,
            default=None,
            help_text=_("A free-form name for the API key. Need not be unique. 50 characters max."),
        )
        revoked = models.BooleanField(
            blank=True,
            default=False,
            help_text=_(
                "If the API key is revoked, clients cannot use it anymore. (This cannot be undone.)"
            ),
        )
        expiry_date = models.DateTimeField(
            blank=True,
            null=True,
            verbose_name=_("Expires"),
            help_text=_("Once API key expires, clients cannot use it anymore."),
        )

        class Meta:
            abstract = True
            ordering = ("-created",)
            verbose_name = "API key"
            verbose_name_plural = "API keys"


__all__ = ["AbstractAPIKey"]
