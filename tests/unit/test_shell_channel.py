"""The terminal's channel against a real Redis: a user's places are counted at once however many open together,
a session that never started frees its place, what is typed is bounded in bytes and refused once the session
is over, and what is left of an ended session expires soon."""

import threading

import pytest
from asgiref.sync import async_to_sync

from jobs import shell_channel


@pytest.fixture
def channel(redis_url, settings):
    settings.REDIS_URL = redis_url
    settings.SHELL_START_SECONDS = 30
    shell_channel.sync_client().flushdb()
    return shell_channel


def opened(channel, user_id: int = 7, most: int = 4):
    return channel.open_session(1, 0, user_id, "alice", 80, 24, most=most)


def test_twelve_opens_at_once_get_no_more_places_than_the_user_may_hold(channel):
    answers: list[str] = []
    start = threading.Barrier(12)

    def open_one() -> None:
        start.wait()
        try:
            opened(channel, most=4)
            answers.append("opened")
        except channel.TooManySessions:
            answers.append("refused")

    threads = [threading.Thread(target=open_one) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers.count("opened") == 4 and answers.count("refused") == 8
    assert channel.open_sessions_of(7) == 4


def test_a_session_whose_relay_could_not_be_queued_frees_its_place_and_an_ended_one_does_too(channel):
    first = opened(channel, most=1)
    with pytest.raises(channel.TooManySessions):
        opened(channel, most=1)
    channel.forget(first)
    second = opened(channel, most=1)
    async_to_sync(channel.write_end)(second.id, "the shell exited")
    assert channel.open_sessions_of(7) == 0
    opened(channel, most=1)


def test_what_is_typed_is_bounded_in_bytes_and_refused_once_the_session_is_over(channel):
    session = opened(channel)
    channel.send_input(session.id, "é" * channel.INPUT_CHUNK_MAX_CHARS)
    with pytest.raises(channel.InputRefused):
        channel.send_input(session.id, "😀" * (channel.INPUT_CHUNK_MAX_CHARS + 64))
    for _ in range(channel.INPUT_QUEUED_MAX - 1):
        channel.send_input(session.id, "x")
    with pytest.raises(channel.InputRefused):
        channel.send_input(session.id, "x")
    async_to_sync(channel.write_end)(session.id, "closed")
    with pytest.raises(channel.SessionOver):
        channel.send_input(session.id, "ls\r")
    client = channel.sync_client()
    assert not client.exists(f"{channel.PREFIX}:{session.id}:in")
    assert 0 < client.ttl(f"{channel.PREFIX}:{session.id}:meta") <= channel.ENDED_KEPT_SECONDS


def test_a_relay_that_starts_after_its_reader_gave_up_opens_nothing(channel):
    session = opened(channel)
    async_to_sync(channel.write_end)(session.id, "no worker of the console took the terminal")
    assert async_to_sync(channel.mark_started)(session.id) is False
    fresh = opened(channel)
    assert async_to_sync(channel.mark_started)(fresh.id) is True
    # Taken by a relay, the record lasts its lease (renewed while the relay lives), not the wait for one.
    assert channel.sync_client().ttl(f"{channel.PREFIX}:{fresh.id}:meta") > 30 + 30


def test_a_reader_waits_on_a_quiet_terminal_longer_than_redis_clients_default_read_timeout(channel):
    # redis-py's asyncio client gives up reading after 5 s by default: a quiet terminal's stream would end.
    session = opened(channel)

    async def quiet_read() -> list:
        try:
            return await channel.read_output(session.id, "0", 6)
        finally:
            await channel.close_async_client()

    assert async_to_sync(quiet_read)() == []
