from django.contrib import admin
from django.urls import include, path

# The admin's "View site" link: this project has no site of its own for staff to view (point it at
# the tenant usage pages where a host mounts them), so it is hidden rather than a dead link.
admin.site.site_url = None

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/llm-budgets/v1/", include("llm_budgets.api.urls")),
    path("usage/", include("llm_budgets.pages.urls")),
    # The tenant pages send anonymous visitors to settings.LOGIN_URL.
    path("accounts/", include("django.contrib.auth.urls")),
]
