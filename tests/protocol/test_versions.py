"""Which versions the coordinator sends a member, from its registration (SPEC.md §3, "Versions
both ways")."""

import attrs
import pytest

from protocol import (
    NEWEST_VERSION,
    ApiKey,
    ApiVersionRange,
    ErrorCode,
    PingRequest,
    RegisterConsumerRequest,
    StopFetcherRequest,
)
from protocol.types import Subscription, TopicPartition, TopicStreams
from protocol.versions import NEWEST, PeerVersions, Refusal, fit, negotiate

REQUEST = RegisterConsumerRequest(
    group_id="g",
    consumer_id="c",
    subscription=Subscription(topics=(TopicStreams(topic="t", streams=1),)),
    auto_commit=True,
    auto_offset_reset="smallest",
    session_timeout_ms=6000,
    generation=-1,
    owned_partitions=(),
)


def _range(key: int, low: int, high: int) -> ApiVersionRange:
    return ApiVersionRange(api_key=key, min_version=low, max_version=high)


def test_a_version_0_registration_is_a_client_of_version_0_of_everything() -> None:
    # Whatever its decoded default says: a version-0 request lists nothing.
    versions = negotiate(REQUEST, 0)
    assert versions == PeerVersions(ping=0, stop_fetcher=0, start_fetcher=0)
    assert isinstance(versions, PeerVersions)
    assert not versions.follows_lease and not versions.incremental


def test_a_version_1_registration_dates_its_client_to_level_2() -> None:
    assert negotiate(REQUEST, 1) == PeerVersions(ping=1, stop_fetcher=2, start_fetcher=2)


def test_a_version_3_registration_gets_the_newest_both_sides_serve() -> None:
    assert negotiate(REQUEST, 3) == NEWEST  # the package's default lists every version
    assert NEWEST.told_when_shed


def test_a_registration_before_version_3_is_sent_no_stop_fetcher_3() -> None:
    # StopFetcher 3 tells a member to come back after a hint; only RegisterConsumer 3's answer
    # can refuse it with that hint if it comes back early (SPEC.md §11.7).
    versions = negotiate(REQUEST, 2)
    assert versions == attrs.evolve(NEWEST, stop_fetcher=2)
    assert isinstance(versions, PeerVersions) and not versions.told_when_shed


def test_a_version_2_registration_gets_the_newest_both_sides_serve() -> None:
    listed = (_range(ApiKey.PING, 0, 9), _range(ApiKey.STOP_FETCHER, 0, 1), _range(99, 0, 5))
    versions = negotiate(attrs.evolve(REQUEST, served_versions=listed), 2)
    # START_FETCHER not listed: version 0 only; an api key the coordinator never sends: ignored
    assert versions == PeerVersions(ping=1, stop_fetcher=1, start_fetcher=0)


@pytest.mark.parametrize(
    ("listed", "instance_id", "code", "message"),
    [
        (
            (_range(ApiKey.PING, 2, 3),),
            None,
            ErrorCode.UNSUPPORTED_VERSION,
            "PING: the consumer reads versions 2-3, this broker sends 0-1",
        ),
        (
            (_range(ApiKey.PING, 0, 1), _range(ApiKey.STOP_FETCHER, 0, 1)),
            "static",
            ErrorCode.UNSUPPORTED_VERSION,
            "a static member (instance_id) must read STOP_FETCHER version 2 or newer;"
            " this one reads 1",
        ),
        (
            (_range(ApiKey.PING, 0, 1), _range(ApiKey.PING, 0, 1)),
            None,
            ErrorCode.INVALID_REQUEST,
            "served_versions: a repeated api key or a bad range:",
        ),
        ((_range(ApiKey.PING, 1, 0),), None, ErrorCode.INVALID_REQUEST, "a bad range"),
        (
            tuple(_range(k, 0, 0) for k in range(100, 165)),
            None,
            ErrorCode.INVALID_REQUEST,
            "served_versions lists 65 ranges, more than 64",
        ),
    ],
    ids=["no-common-version", "static-without-reason", "repeated", "inverted", "too-many"],
)
def test_a_registration_no_rule_serves_is_refused_with_a_code_and_a_message(
    listed: tuple[ApiVersionRange, ...], instance_id: str | None, code: ErrorCode, message: str
) -> None:
    request = attrs.evolve(REQUEST, served_versions=listed, instance_id=instance_id)
    refusal = negotiate(request, 2)
    assert isinstance(refusal, Refusal)
    assert refusal.error_code is code
    assert message in refusal.message


def test_fit_drops_only_the_frame_count_an_older_version_lacks() -> None:
    ping = PingRequest(
        coordinator_epoch=1, generation=2, consumer_id="c", num_retries=0, acknowledged_frames=5
    )
    assert fit(ping, 0) == attrs.evolve(ping, acknowledged_frames=-1)
    assert fit(ping, 1) is ping
    partial = StopFetcherRequest(
        coordinator_epoch=1,
        generation=2,
        consumer_id="c",
        acknowledged_frames=5,
        partitions=(TopicPartition(topic="t", partition=0),),
    )
    # a partial stop keeps its partitions, which the Connection then refuses to drop
    assert fit(partial, 0).partitions == partial.partitions


#: The newest version of each api at the latest level of SPEC.md's table (§3). A version is
#: added, never removed: the broker must still serve each, and a frozen client of each level
#: (tests/frozen) speaks them.
EVER = {
    ApiKey.PRODUCE: 1,
    ApiKey.FETCH: 1,
    ApiKey.CLUSTER_METADATA: 1,
    ApiKey.REGISTER_CONSUMER: 2,
    ApiKey.PING: 1,
    ApiKey.STOP_FETCHER: 3,
    ApiKey.START_FETCHER: 2,
    ApiKey.CREATE_TOPIC: 1,
    ApiKey.CREATE_PARTITIONS: 1,
    ApiKey.DESCRIBE_GROUP: 3,
}


def test_no_version_is_ever_removed() -> None:
    for key in ApiKey:
        assert NEWEST_VERSION[key] >= EVER.get(key, 0), key.name
    for version in range(NEWEST_VERSION[ApiKey.REGISTER_CONSUMER] + 1):
        # every RegisterConsumer version is still served, each with a rule
        assert isinstance(negotiate(REQUEST, version), PeerVersions)
