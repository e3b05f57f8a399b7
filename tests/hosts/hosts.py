"""The host matrix's cases: one host convention each (docs/adopting.md)."""

from __future__ import annotations

from tests.hosts.docs import convention
from tests.hosts.generate import Host

ACCOUNTS_MODELS = '''\
from django.contrib.auth.models import AbstractBaseUser, BaseUserManager, PermissionsMixin
from django.db import models


class UserManager(BaseUserManager):
    use_in_migrations = True

    def create_user(self, email, password=None, **extra):
        user = self.model(email=self.normalize_email(email), **extra)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_superuser(self, email, password=None, **extra):
        extra.setdefault("is_staff", True)
        extra.setdefault("is_superuser", True)
        return self.create_user(email, password, **extra)


class User(AbstractBaseUser, PermissionsMixin):
    """Email login, as cookiecutter-django and django-allauth hosts have it: no ``username``."""

    email = models.EmailField(unique=True)
    name = models.CharField(max_length=100, blank=True)
    is_staff = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    objects = UserManager()
'''

ACCOUNTS_ADMIN = """\
from django.contrib import admin

from accounts.models import User


@admin.register(User)
class UserAdmin(admin.ModelAdmin):
    search_fields = ["email", "name"]
"""

ACCOUNTS_MIGRATION = """\
import accounts.models
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
    ]

    operations = [
        migrations.CreateModel(
            name='User',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('password', models.CharField(max_length=128, verbose_name='password')),
                ('last_login', models.DateTimeField(blank=True, null=True, verbose_name='last login')),
                ('is_superuser', models.BooleanField(default=False, help_text='Designates that this user has all permissions without explicitly assigning them.', verbose_name='superuser status')),
                ('email', models.EmailField(max_length=254, unique=True)),
                ('name', models.CharField(blank=True, max_length=100)),
                ('is_staff', models.BooleanField(default=False)),
                ('is_active', models.BooleanField(default=True)),
                ('groups', models.ManyToManyField(blank=True, help_text='The groups this user belongs to. A user will get all permissions granted to each of their groups.', related_name='user_set', related_query_name='user', to='auth.group', verbose_name='groups')),
                ('user_permissions', models.ManyToManyField(blank=True, help_text='Specific permissions for this user.', related_name='user_set', related_query_name='user', to='auth.permission', verbose_name='user permissions')),
            ],
            options={
                'abstract': False,
            },
            managers=[
                ('objects', accounts.models.UserManager()),
            ],
        ),
    ]
"""

# docs/adopting.md's step 8 as its "Email login" section writes it: run inside the host
# (tests/hosts/inside/test_email_login.py, through the generated tests/doc_commands.py).
EMAIL_LOGIN_COMMANDS = [
    "DJANGO_SUPERUSER_PASSWORD=change-me python manage.py createsuperuser --noinput "
    "--email ada@example.com",
    "python manage.py llm_budgets_membership add ada@example.com acme --role admin",
]

EMAIL_LOGIN = Host(
    name="email_login",
    apps=["accounts"],
    settings='AUTH_USER_MODEL = "accounts.User"\n',
    files={
        "accounts/__init__.py": "",
        "accounts/models.py": ACCOUNTS_MODELS,
        "accounts/admin.py": ACCOUNTS_ADMIN,
        "accounts/migrations/__init__.py": "",
        "accounts/migrations/0001_initial.py": ACCOUNTS_MIGRATION,
        "tests/doc_commands.py": f"EMAIL_LOGIN_COMMANDS = {EMAIL_LOGIN_COMMANDS!r}\n",
    },
)

# Strict DRF defaults (cookiecutter-django's and stricter) and the host's own drf-spectacular
# schema and docs, admin-only; every request in a transaction.
STRICT_DRF_SETTINGS = convention("hostproj/settings.py: strict DRF")

HOST_API = """\
from rest_framework.response import Response
from rest_framework.views import APIView


class Ping(APIView):
    def get(self, request):
        return Response({"pong": True})


class Me(APIView):
    def get(self, request):
        return Response({"id": request.user.pk})
"""

STRICT_DRF = Host(
    name="strict_drf",
    settings=STRICT_DRF_SETTINGS,
    files={"shop/api.py": HOST_API},
    urls="""\
path("api/ping/", __import__("shop.api").api.Ping.as_view()),
path("api/me/", __import__("shop.api").api.Me.as_view()),
path("api/schema/", __import__("drf_spectacular.views").views.SpectacularAPIView.as_view(), name="schema"),
path("api/docs/", __import__("drf_spectacular.views").views.SpectacularSwaggerView.as_view(url_name="schema")),
""",
)

CELERY_APP = """\
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostproj.settings")
app = Celery("hostproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
"""

# django-celery-beat's DatabaseScheduler: the schedule lives in rows an operator edits.
CELERY_BEAT = Host(
    name="celery_beat",
    apps=["django_celery_beat"],
    settings=convention("hostproj/settings.py: celery beat"),
    files={
        "hostproj/celery.py": CELERY_APP,
        "hostproj/__init__.py": 'from hostproj.celery import app as celery_app\n\n__all__ = ["celery_app"]\n',
    },
)

# A Bootstrap-like base template whose blocks are not llm_budgets' own.
HOST_BASE = """\
{% load static %}<!DOCTYPE html>
<html><head><title>{% block head_title %}Host{% endblock %}</title>
{% block css %}<link rel="stylesheet" href="{% static 'host/bootstrap.css' %}">{% endblock %}
</head><body><nav class="host-navbar">Host navbar</nav>
<div class="container">{% block page %}{% endblock %}</div>
{% block javascript %}{% endblock %}</body></html>
"""

# The restyle recipe of docs/adopting.md (docs/pages.md), for this base.
PAGES_BASE = convention("templates/llm_budgets/pages/base.html")

OTHER_BLOCKS = Host(
    name="other_blocks",
    files={
        "templates/base.html": HOST_BASE,
        "templates/llm_budgets/pages/base.html": PAGES_BASE,
    },
)


def postgres_database(engine: str) -> str:
    """A host's settings for its own PostgreSQL database beside the suite's (same server and
    user; the matrix passes them as HOST_PG_* variables)."""
    return f"""\
import os

DATABASES = {{
    "default": {{
        "ENGINE": "{engine}",
        "NAME": os.environ["HOST_PG_NAME"],
        "USER": os.environ["HOST_PG_USER"],
        "PASSWORD": os.environ["HOST_PG_PASSWORD"],
        "HOST": os.environ["HOST_PG_HOST"],
        "PORT": os.environ["HOST_PG_PORT"],
        "TEST": {{"NAME": os.environ["HOST_PG_TEST_NAME"]}},
    }}
}}
"""


SQLITE_HOSTS = [EMAIL_LOGIN, STRICT_DRF, CELERY_BEAT, OTHER_BLOCKS]

# cookiecutter-django's default, every request in one transaction, on PostgreSQL (its own
# database beside the suite's): a guarded view that holds a reservation across a slow provider
# call, under parallel requests of one tenant through a real server (issue #37).
ATOMIC_REQUESTS_SETTINGS = (
    postgres_database("django.db.backends.postgresql")
    + 'DATABASES["default"]["ATOMIC_REQUESTS"] = True\n'
)

GUARDED_VIEW = """\
import threading

from django.http import HttpResponse

from llm_budgets import budgets

REQUESTS = 4
# The fake provider answers only once every request has been admitted: a barrier, not a clock.
provider = threading.Barrier(REQUESTS)


def guarded(request):
    hold = budgets.reserve(
        tenant="acme",
        end_user=f"u{request.GET.get('u', '0')}",
        provider="openai",
        model="gpt-4o",
        input_tokens=100,
        max_output_tokens=100,
    )
    provider.wait(timeout=30)  # BrokenBarrierError: an admission waited on another's locks
    hold.commit(input_tokens=100, output_tokens=50)
    return HttpResponse("ok")
"""

ATOMIC_REQUESTS = Host(
    name="atomic_requests",
    settings=ATOMIC_REQUESTS_SETTINGS,
    files={"shop/guarded.py": GUARDED_VIEW},
    urls='path("guarded/", __import__("shop.guarded").guarded.guarded),\n',
)

# django-tenants: schema per tenant. llm_budgets lives in the shared (public) schema with the
# users; a host tenant (Client) maps to the llm_budgets tenant of the same id (its schema name).
CUSTOMERS_MODELS = """\
from django.db import models
from django_tenants.models import DomainMixin, TenantMixin


class Client(TenantMixin):
    name = models.CharField(max_length=100)
    auto_create_schema = True


class Domain(DomainMixin):
    pass
"""

CUSTOMERS_APPS = convention("customers/apps.py")

TENANTS_TENANCY = (
    convention("shop/tenancy.py")
    + """

def create_host_tenant(external_id, name):
    from customers.models import Client, Domain
    from django.db import connection

    connection.set_schema_to_public()  # tenants are created from the public schema
    client = Client.objects.create(schema_name=external_id, name=name)
    Domain.objects.create(domain=f"{external_id}.localhost", tenant=client, is_primary=True)
"""
)

# The host's database (the suite's server, a database of its own), then the recipe.
DJANGO_TENANTS_SETTINGS = postgres_database("django_tenants.postgresql_backend") + convention(
    "hostproj/settings.py: django-tenants"
)

CUSTOMERS_MIGRATION = """\
import django.db.models.deletion
import django_tenants.postgresql_backend.base
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='Client',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('schema_name', models.CharField(db_index=True, max_length=63, unique=True, validators=[django_tenants.postgresql_backend.base._check_schema_name])),
                ('name', models.CharField(max_length=100)),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.CreateModel(
            name='Domain',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('domain', models.CharField(db_index=True, max_length=253, unique=True)),
                ('is_primary', models.BooleanField(db_index=True, default=True)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='domains', to='customers.client')),
            ],
            options={
                'abstract': False,
            },
        ),
    ]
"""

DJANGO_TENANTS = Host(
    name="django_tenants",
    settings=DJANGO_TENANTS_SETTINGS,
    middleware_first=["django_tenants.middleware.main.TenantMainMiddleware"],
    files={
        "customers/__init__.py": "",
        "customers/models.py": CUSTOMERS_MODELS,
        "customers/apps.py": CUSTOMERS_APPS,
        "customers/migrations/__init__.py": "",
        "customers/migrations/0001_initial.py": CUSTOMERS_MIGRATION,
        "shop/tenancy.py": TENANTS_TENANCY,
    },
)

# The conventions blocks of docs/adopting.md these hosts are built from (tests/test_adopting.py
# checks that none is left out); the shell blocks are the celery host's schedule install and the
# email-login host's step 8.
DOC_LABELS = {
    "hostproj/settings.py: strict DRF",
    "hostproj/settings.py: celery beat",
    "templates/llm_budgets/pages/base.html",
    "hostproj/settings.py: django-tenants",
    "customers/apps.py",
    "shop/tenancy.py",
}
DOC_COMMANDS = {"python manage.py llm_budgets_install_schedule", *EMAIL_LOGIN_COMMANDS}
