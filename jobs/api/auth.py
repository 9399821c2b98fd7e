"""API tokens: `Authorization: Token <token>` (or `Bearer <token>`), checked against stored digests."""

from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from jobs.models import ApiToken


class HashedTokenAuthentication(TokenAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if header.startswith("Bearer "):
            return self.authenticate_credentials(header[len("Bearer "):])
        return super().authenticate(request)

    def authenticate_credentials(self, key):
        user = ApiToken.user_of(key)
        if user is None:
            raise AuthenticationFailed("Invalid token.")
        return user, None
