"""PostgreSQL memory backend, on asyncpg: for several host processes on several machines.

Same semantics as :class:`~host_stub.memory.sqlite.SQLiteMemory`; what differs is how they are
kept when many connections write at once:

- Every write that touches a session's messages first locks that session's row in ``sessions``
  (``append`` and ``clear`` through an upsert, the others with ``SELECT ... FOR UPDATE``) and
  holds the lock until commit. ``append`` takes its seqs from ``sessions.last_seq`` under that
  lock, in the transaction that inserts the messages, so seqs are gapless and in commit order: the
  next appender waits for the commit and then reads the new counter. No sequence object, whose
  values are handed out outside the transaction, is involved.
- Writes on a session that may have no row yet (``clear``, ``forget``, a ``commit_compression``
  that found no row) also take a transaction-scoped advisory lock on the session, so they
  serialize even when there is no row to lock.
- Compare-and-set on metadata versions is decided by the writing statement itself (``INSERT ...
  ON CONFLICT DO NOTHING`` for "never written", ``UPDATE ... WHERE version = $n`` otherwise), so
  two writers with the same expected version cannot both win.
- ``commit_compression`` is one transaction: session lock, epoch check, version compare-and-set,
  archive.
- ``snapshot`` reads in one ``REPEATABLE READ`` read-only transaction.
- Leases are rows whose ``expires_at`` is taken from the server's clock, so hosts with skewed
  clocks agree on expiry; a crashed holder's lease simply runs out. A row outlives its releases:
  its ``fence`` grows by one on every acquisition, and a fenced write share-locks the row while it
  checks it, so no acquisition slips in before its commit.

- Search: an inverted index in tables of its own, read from primary keys alone. Each term of a
  session has a row in ``search_terms`` (session key, term, document frequency, ``id``); a
  term's postings are rows of ``search_postings`` (term id, ``block`` = seq >> 6, ``bits``: bit
  seq & 63 set for each message holding the term), primary key ``(term_id, block)`` with the
  bits included, so a term's postings are read newest or oldest first by an index-only scan
  (a few rows for a rare term, at most one per 64 messages for a common one) and two terms'
  are intersected block by block. A message's role is one more term (``" role:<role>"``, no
  query term holds a space), so a search for one role intersects with it. ``search_entries``
  (session key, seq, own terms, lent terms, each space-joined) is what each message is indexed
  under: the candidates' term frequencies and lengths are read from it, and a deleted
  message's postings found. Entries, postings, document frequencies and the session's
  ``search_docs``/``search_length`` are written in the transaction that indexes or unindexes,
  under the session's row lock (``archive`` leaves the index as it is). A search follows
  ``search_plan.plan_search`` in five statements: the counts and term ids; every read (a
  term's blocks, the newest first when only the newest count; a conjunction's and a role's
  joined block by block, a conjunction of three terms extending the one of its rarest two);
  the probes among the candidates (their blocks joined with each probed term's); the chosen
  candidates' entries with their messages' roles (and, for an assistant's, whether its body
  holds tool calls), ranked by ``search_plan.rank``; the messages found.
  Index-only scans need the visibility map, which autovacuum keeps (pages written since its
  last run cost a visit each).
  Before schema 5 the index was a ``tsvector`` per message with a GIN index: every posting
  read was a visit to a wide row, tens of milliseconds in a session of 500,000 messages.

URL: ``postgresql://user:password@host:port/database`` (``postgres://`` too); the query string is
passed to asyncpg (``sslmode=...``, server settings), except ``schema=<name>``, which selects (and
creates) a PostgreSQL schema for the tables. The pool is created, and the schema created or
migrated (under an advisory lock, so processes starting together do not race), on first use.
JSON bodies are stored as ``text``, not ``jsonb``: ``jsonb`` refuses ``\\u0000`` in strings and
reorders keys, and a message must come back exactly as it went in.
"""

from ..common import redact_url
from .connection import SERVER_SETTINGS as SERVER_SETTINGS
from .connection import server_settings as server_settings
from .schema import MIGRATIONS, SCHEMA_VERSION
from .search import entry_of
from .store import PostgresMemory

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresMemory", "entry_of", "redact_url"]
