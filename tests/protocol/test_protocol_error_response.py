"""error_response answers any request with only an error, and the answer is a valid frame."""

from hypothesis import given

from protocol import (
    COORDINATOR_REQUESTS,
    Connection,
    ErrorCode,
    RequestMessage,
    Response,
    Role,
    error_response,
)
from tests.protocol.strategies import error_codes, request_messages


@given(request=request_messages, code=error_codes)
def test_an_error_response_answers_any_request_on_the_wire(
    request: RequestMessage, code: ErrorCode
) -> None:
    sender_role = Role.BROKER if request.API_KEY in COORDINATOR_REQUESTS else Role.CONSUMER
    receiver_role = Role.CONSUMER if sender_role is Role.BROKER else Role.BROKER
    sender, receiver = Connection(sender_role), Connection(receiver_role)
    receiver.receive_data(sender.send(sender.new_request(request)))
    received = receiver.next_event()
    answer = error_response(request, code)
    assert answer.error_code is code
    sender.receive_data(receiver.send(received.response(answer)))  # type: ignore[union-attr]
    event = sender.next_event()
    assert isinstance(event, Response) and event.message == answer
