"""The measures of ``bench/meaning.py`` on small hand-made inputs (each fails when its function is
broken), and the script itself in ``--quick`` mode when the data is there."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_modules import BENCH
from datasets import require

from host_stub.datasets import Conversation
from host_stub.messages import Message, ToolCall, ToolCallFunction

# Imported by its own name from bench/ (its dataclasses need their module in sys.modules, which
# bench_modules.load_bench does not register).
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
meaning = importlib.import_module("meaning")
ROOT = BENCH.parent


# -- words -----------------------------------------------------------------------------------------


def test_stem_joins_the_forms_of_a_word() -> None:
    stem = meaning.stem
    assert stem("cancelled") == stem("cancel") == stem("canceled")
    assert stem("booked") == stem("book") == stem("booking")
    assert stem("updated") == stem("update") == stem("updating")
    assert stem("transferred") == stem("transfer")
    assert stem("classes") == stem("class")
    assert stem("modified") == stem("modify")
    assert stem("painting") == stem("paints") == "paint"
    assert stem("amy's") == stem("Amy") == "amy"
    assert stem("book") != stem("cancel")


def test_terms_drop_stop_words_and_stem() -> None:
    assert meaning.terms("When did Caroline go to the support groups?") == {
        "carolin",
        "support",
        "group",
    }


# -- A: statements of actions ----------------------------------------------------------------------


def test_read_only_tools_by_a_word_of_their_name() -> None:
    for name in ("get_user_details", "search_direct_flight", "list_all_airports", "think"):
        assert meaning.is_read_only(name), name
    assert meaning.is_read_only("getUserDetails") and meaning.is_read_only("calculate")
    for name in ("cancel_reservation", "book_reservation", "update_reservation_flights"):
        assert not meaning.is_read_only(name), name
    assert not meaning.is_read_only("send_certificate")
    assert not meaning.is_read_only("transfer_to_human_agents")
    # A word, not a substring: "target" holds "get".
    assert not meaning.is_read_only("set_target")


def test_verb_matches_its_forms_the_t_past_and_synonyms() -> None:
    vm = meaning.verb_matches
    assert vm("cancelled", "cancel") and vm("booked", "book") and vm("transferred", "transfer")
    assert vm("sent", "send") and vm("send", "send")
    assert vm("changed", "update") and vm("updated", "update")
    assert not vm("booked", "cancel") and not vm("sent", "book") and not vm("changed", "cancel")


def test_segments_split_lines_at_semicolons_and_full_stops() -> None:
    text = "a one; b two. c three\n\n- d four.e"
    assert meaning.segments(text) == ["a one", "b two", "c three", "- d four.e"]


def test_names_id_needs_the_whole_token() -> None:
    assert meaning.names_id("reservation ABC123 (user x)", "ABC123")
    assert not meaning.names_id("reservation ABC1234", "ABC123")
    assert not meaning.names_id("user mia_li_36", "li_36")


def _action(tool: str, key: str | None) -> object:
    verb = meaning.tool_words(tool)[0]
    return meaning.Action(tool=tool, verb=verb, key=key, trajectory="t", position=0, arguments="")


def test_recoverable_needs_the_id_and_the_verb_in_one_segment() -> None:
    cancel = _action("cancel_reservation", "ABC123")
    assert meaning.recoverable(cancel, ["reservation ABC123: cancelled"])
    # The id and the verb in different segments, or the wrong verb, do not count.
    assert not meaning.recoverable(cancel, ["reservation ABC123", "cancelled it"])
    assert not meaning.recoverable(cancel, ["reservation ABC123: booked"])
    assert not meaning.recoverable(cancel, ["reservation XYZ789: cancelled"])
    # No key id known: a segment saying what was done is enough.
    transfer = _action("transfer_to_human_agents", None)
    assert meaning.recoverable(transfer, ["transferred to human agents"])
    assert not meaning.recoverable(transfer, ["looked up the user"])
    # A key given overrides the action's.
    assert meaning.recoverable(cancel, ["XYZ789 cancelled"], key="XYZ789")


def test_key_id_order() -> None:
    key = meaning.key_id
    assert key({"reservation_id": "R1X2Y3", "user_id": "u_1"}, None, "u_9") == "R1X2Y3"
    assert key({"user_id": "u_1"}, "NEW123", "u_9") == "NEW123"
    assert key({"user_id": "u_1"}, None, "u_9") == "u_1"
    assert key({"summary": "help"}, None, "u_9") == "u_9"
    assert key({}, None, None) is None


def test_returned_id_only_when_new() -> None:
    assert meaning.returned_id('{"reservation_id": "NEW123"}', {"user_id": "u"}) == "NEW123"
    assert meaning.returned_id('{"reservation_id": "R1"}', {"reservation_id": "R1"}) is None
    assert meaning.returned_id("Error: payment amount does not add up", {}) is None
    assert meaning.returned_id("[1, 2]", {}) is None


def test_state_changing_actions_keyed_from_calls_results_and_trajectories() -> None:
    def call(call_id: str, name: str, **args: object) -> Message:
        fn = ToolCallFunction(name=name, arguments=json.dumps(args))
        return Message(
            role="assistant", content=None, tool_calls=[ToolCall(id=call_id, function=fn)]
        )

    def result(call_id: str, body: str) -> Message:
        return Message(role="tool", tool_call_id=call_id, content=body)

    first = Conversation(
        "t0",
        [
            Message(role="system", content="policy"),
            call("c1", "get_user_details", user_id="amy_1"),
            result("c1", "{}"),
            call("c2", "book_reservation", user_id="amy_1"),
            result("c2", '{"reservation_id": "NEW123"}'),
        ],
        info={"task": {"user_id": "amy_1"}},
    )
    second = Conversation(
        "t1",
        [
            Message(role="system", content="policy"),
            call("c1", "transfer_to_human_agents", summary="help"),
            result("c1", "Transfer successful"),
            call("c3", "cancel_reservation", reservation_id="OLD999"),
            result("c3", "Error: not allowed"),
        ],
        info={"task": {"user_id": "bob_2"}},
    )
    owners = meaning.chain_owners([first, second])
    chain = meaning.tau_chain([first, second])
    assert owners == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert len(owners) == len(chain.messages)
    actions = meaning.state_changing_actions(chain.messages, range(9), owners, [first, second])
    got = [(a.tool, a.verb, a.key, a.trajectory, a.failed) for a in actions]
    assert got == [
        ("book_reservation", "book", "NEW123", "t0", False),
        ("transfer_to_human_agents", "transfer", "bob_2", "t1", False),
        ("cancel_reservation", "cancel", "OLD999", "t1", True),
    ]
    # Only the positions asked for.
    assert meaning.state_changing_actions(chain.messages, [7], owners, [first, second])[0].key == (
        "OLD999"
    )


def test_dates_and_bare_id_lines() -> None:
    assert meaning.is_date("2024-05-20") and meaning.is_date("05/20/2024")
    assert not meaning.is_date("HAT136") and not meaning.is_date("mia_li_3668")
    assert meaning.is_bare_id_line("Identifiers: HAT057 HAT268 credit_card_9525117 X7BYG1")
    assert not meaning.is_bare_id_line(
        "- reservation JG7FMM (user omar_davis_3817): updated flights"
    )
    assert meaning.is_bare_id_line("- HAT057, HAT268; 2024-05-20")
    assert not meaning.is_bare_id_line("Identifiers: the user asked twice about HAT057")
    assert not meaning.is_bare_id_line("")
    # An id list: identifiers after at most one opening label, nothing else.
    assert meaning.is_id_list_line("Identifiers: HAT057 HAT268 X7BYG1")
    assert meaning.is_id_list_line("HAT057, HAT268")
    assert not meaning.is_id_list_line("- reservation JG7FMM (user omar_davis_3817): HAT028 HAT277")
    assert not meaning.is_id_list_line("HAT057 Identifiers: HAT268")
    assert not meaning.is_id_list_line("Goal: change the flight")


def test_summary_block_is_the_summary_system_message() -> None:
    prompt = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "system", "content": "head\n<conversation-summary>\nX\n</conversation-summary>"},
        {"role": "user", "content": "<conversation-summary> quoted by the user"},
    ]
    assert meaning.summary_block(prompt) == prompt[1]["content"]


# -- B: the question-driven reader -----------------------------------------------------------------


def test_sentences_split_at_line_ends_and_sentence_ends() -> None:
    text = "[1 May] Amy: I moved to Paris. It rains!  Do you like it?\nBob: 3.5 km away?Yes."
    assert meaning.sentences(text) == [
        "[1 May] Amy: I moved to Paris.",
        "It rains!",
        "Do you like it?",
        "Bob: 3.5 km away?Yes.",
    ]


def test_idf_weighs_rare_terms_higher() -> None:
    weights = meaning.idf([{"amy", "paris"}, {"amy", "rain"}, {"amy"}])
    assert weights["paris"] > weights["amy"] > 0
    assert weights["paris"] == weights["rain"]


def test_score_and_top_k() -> None:
    sents = [{"amy", "paris"}, {"amy", "rain"}, {"amy"}, {"bob"}]
    weights = meaning.idf(sents)
    question = {"amy", "paris"}
    assert meaning.score_sentence(question, sents[0], weights) == pytest.approx(
        weights["amy"] + weights["paris"]
    )
    assert meaning.score_sentence(question, sents[3], weights) == 0
    # Best first; ties in context order; sentences scoring 0 never picked.
    assert meaning.top_k(question, sents, weights, 2) == [0, 1]
    assert meaning.top_k(question, sents, weights, 10) == [0, 1, 2]


def test_found_needs_every_answer_token_in_the_chosen_sentences() -> None:
    chosen = ["Amy moved to Paris in 2022.", "She adopted two dogs."]
    assert meaning.found("Paris", chosen)
    assert meaning.found("2022, Paris", chosen)
    assert meaning.found("dog", chosen)  # stemmed: dogs
    assert not meaning.found("Paris and London", chosen)
    # No content token: the answer string itself.
    assert meaning.found("to", chosen)
    assert not meaning.found("no", chosen)
    assert not meaning.found("", chosen)


def test_reader_finds_the_answer_sentence_by_the_question() -> None:
    context = "\n".join(
        [
            "Amy: I went hiking last weekend.",
            "Bob: Nice. Amy: My sister moved to Lisbon in March.",
            "Bob: Where did your sister move?",
            *[f"Amy: filler line number {i} about nothing." for i in range(10)],
        ]
    )
    reader = meaning.Reader.of(context)
    assert reader.finds("Where did Amy's sister move to?", "Lisbon")
    assert reader.finds("Where did Amy's sister move to?", "Lisbon", k=1)
    assert reader.finds("Where did Amy go hiking?", "weekend", k=1)
    assert not reader.finds("Where did Amy go hiking?", "Lisbon", k=1)
    assert not reader.finds("What colour is the car?", "Lisbon")


# -- the script ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_script_runs_quick_and_writes_its_results(tmp_path: Path) -> None:
    for relative in ("locomo/locomo_dev.json", "tau_bench/airline_dev.json"):
        require(relative)
    done = subprocess.run(
        [sys.executable, str(BENCH / "meaning.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\n| " in done.stdout and "|---" in done.stdout, done.stdout[-2000:]
    md, js = tmp_path / "meaning.md", tmp_path / "meaning.json"
    data = json.loads(js.read_text(encoding="utf-8"))
    assert data["name"] == "meaning" and len(data["tables"]) == 3
    assert all(t["rows"] for t in data["tables"])
    assert data["command"].startswith("python bench/meaning.py --quick")
    assert "plugin_actions_missed" in data["extra"] and "reader" in data["extra"]
    # Results never name a place outside the repository.
    assert str(tmp_path) not in md.read_text(encoding="utf-8")
    assert str(tmp_path) not in js.read_text(encoding="utf-8")
