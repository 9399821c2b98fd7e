"""A webhook's address can name no private, loopback or reserved host in any of IPv6's ways of carrying an
IPv4 address: mapped, compatible, NAT64 (well-known and local-use prefixes), 6to4 and Teredo."""

import pytest
from django.test import Client

from jobs import notifications
from jobs.models import Webhook

pytestmark = pytest.mark.django_db

LOOPBACK_IN_DISGUISE = [
    "http://[::127.0.0.1]/hook",          # IPv4-compatible, dotted
    "http://[::7f00:1]/hook",             # IPv4-compatible, hex
    "http://[64:ff9b::7f00:1]/hook",      # NAT64's well-known prefix
    "http://[64:ff9b::10.0.0.5]/hook",    # NAT64, a private network behind it
    "http://[64:ff9b:1::a9fe:a9fe]/hook",  # NAT64's local-use prefix, the cloud metadata address
    "http://[2002:7f00:1::]/hook",        # 6to4
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/hook",  # Teredo, client 127.0.0.1
]


@pytest.mark.attack("a webhook aimed at loopback or a private network through an IPv6 form that embeds IPv4",
                    "refused when saved, never called")
@pytest.mark.parametrize("url", LOOPBACK_IN_DISGUISE)
def test_a_webhook_to_an_ipv4_address_hidden_in_ipv6_is_refused_where_it_is_typed(settings, owner, url):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    client = Client()
    client.force_login(owner)

    response = client.post("/webhook", {"url": url})

    assert response.status_code == 200  # the form again, with the error beside the field
    assert b"private, loopback or reserved" in response.content
    assert not Webhook.objects.filter(user=owner).exists()
    with pytest.raises(notifications.WebhookRefused):
        notifications.check_url(url)


def test_a_public_ipv4_address_behind_nat64_is_still_accepted(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    target = notifications.check_url("https://[64:ff9b::5db8:d70e]/hook")  # 93.184.215.14
    assert target.addresses == ("64:ff9b::5db8:d70e",)
