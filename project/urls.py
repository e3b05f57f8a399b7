from django.contrib import admin
from django.urls import include, path, reverse_lazy

# The admin's "View site" link goes to the tenant usage pages: support staff get a tenant picker
# there (and every admin tenant page links to its own usage pages with ?tenant=).
admin.site.site_url = reverse_lazy("llm_budgets_pages:overview")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/llm-budgets/v1/", include("llm_budgets.api.urls")),
    path("usage/", include("llm_budgets.pages.urls")),
    # The tenant pages send anonymous visitors to settings.LOGIN_URL.
    path("accounts/", include("django.contrib.auth.urls")),
]
