"""Every sans-IO layer refuses an input it does not take now with one family of exceptions,
``protocol.IllegalInput``, having changed nothing; the names each layer raised before stay, as
members of the family, so code that caught them goes on catching them."""

import copy

import pytest

from protocol import (
    ClusterMetadataRequest,
    Connection,
    IllegalInput,
    ListGroupsRequest,
    LocalProtocolError,
    ProtocolError,
    Request,
    Role,
)
from protocol.sasl import IllegalSaslState, ServerExchange
from protocol.types import TopicPartition
from statemachine import consumer as c
from statemachine import group as g
from statemachine import ownership as o
from statemachine.table import IllegalTransition
from transport.scram import SCRAMP


def test_the_connection_refuses_what_we_may_not_send_as_an_illegal_input() -> None:
    connection = Connection(Role.CONSUMER, client_id="c")
    with pytest.raises(IllegalInput) as raised:
        connection.send(Request(correlation_id=-1, message=ListGroupsRequest()))
    assert isinstance(raised.value, LocalProtocolError)
    assert isinstance(raised.value, ProtocolError)  # caught as a protocol error, as before
    assert connection.outstanding_requests == frozenset()


def test_the_sasl_exchange_refuses_a_message_out_of_turn_as_an_illegal_input() -> None:
    server = ServerExchange(engine=SCRAMP)
    with pytest.raises(IllegalInput) as raised:
        server.receive(ClusterMetadataRequest(group_id=None, topics=None))
    assert isinstance(raised.value, IllegalSaslState)
    assert not server.done


def test_a_table_refuses_an_input_it_does_not_list_as_an_illegal_input() -> None:
    machine = c.ConsumerMachine(config=c.ConsumerConfig(session_timeout=6.0))
    before = copy.deepcopy(machine)
    with pytest.raises(IllegalInput) as raised:
        machine.handle(c.LeaseExpired(now=1.0))
    assert isinstance(raised.value, IllegalTransition)
    assert machine.state is before.state is c.ConsumerState.IDLE


def test_what_no_table_decides_is_refused_as_an_illegal_input_too() -> None:
    # Checks beside the tables: a generation that does not grow, an incarnation registered twice.
    group = g.GroupMachine(group_id="g", state=g.GroupState.PENDING, generation=4)
    with pytest.raises(IllegalInput):
        group.handle(g.AttemptBegan(generation=4))
    assert (group.state, group.generation) == (g.GroupState.PENDING, 4)

    ownership = o.Ownership()
    tp = TopicPartition(topic="t", partition=0)
    ownership.handle(o.Started(generation=1, starts={1: ("a", frozenset({tp}))}, now=0.0))
    before = copy.deepcopy(ownership)
    registered = o.OwnerRegistered(owner="a", incarnation=1, generation=1, holding=(tp,), now=1.0)
    with pytest.raises(IllegalInput):
        ownership.handle(registered)
    assert ownership == before
