"""The PostgreSQL store's schema: its version and the migration steps that build it."""

from __future__ import annotations

#: Stored in ``memory_schema_version``; bump it and add a step to ``MIGRATIONS`` on changes.
SCHEMA_VERSION = 5

#: Migration steps, from version ``n`` to ``n + 1``. ``{p}`` is the schema prefix.
MIGRATIONS: dict[int, list[str]] = {
    0: [
        """CREATE TABLE IF NOT EXISTS {p}sessions (
            session_id text PRIMARY KEY,
            epoch      bigint NOT NULL DEFAULT 0,
            last_seq   bigint NOT NULL DEFAULT 0,
            updated_at double precision NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS {p}messages (
            session_id  text NOT NULL,
            seq         bigint NOT NULL,
            epoch       bigint NOT NULL,
            role        text NOT NULL,
            kind        text NOT NULL,
            body        text NOT NULL,
            tokens      bigint NOT NULL,
            archived    text NULL,
            archived_at double precision NULL,
            created_at  double precision NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
        """CREATE TABLE IF NOT EXISTS {p}metadata (
            namespace  text NOT NULL,
            key        text NOT NULL,
            value      text NULL,
            version    bigint NOT NULL,
            deleted    boolean NOT NULL DEFAULT false,
            updated_at double precision NOT NULL,
            PRIMARY KEY (namespace, key)
        )""",
        "CREATE INDEX IF NOT EXISTS metadata_by_key ON {p}metadata (key)",
        """CREATE TABLE IF NOT EXISTS {p}leases (
            name       text PRIMARY KEY,
            token      text NOT NULL,
            expires_at double precision NOT NULL
        )""",
    ],
    # The search index: the message's terms as a tsvector (NULL: not searchable), filled for
    # the stored messages by ``backfill_search``.
    1: [
        "ALTER TABLE {p}messages ADD COLUMN IF NOT EXISTS search tsvector NULL",
        "CREATE INDEX IF NOT EXISTS messages_search ON {p}messages USING gin (search)",
    ],
    # 2 -> 3: fencing tokens. A lease row stays after its release (token emptied) so the fence
    # of its next holder keeps growing.
    2: ["ALTER TABLE {p}leases ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0"],
    # 3 -> 4: a search reads only the postings it needs (see search_plan.plan_search), from a table
    # of its own: ``search_docs``, one row per indexed message, without the message's body (a
    # search visits the row of each posting it reads). Each
    # session gets a key its lexemes start with ("<key>_<term>"), so the GIN index holds one
    # posting list per session and term; and what BM25 ranks with: the number and total length
    # of a session's indexed messages, each message's length, each term's document frequency.
    # ``_convert_search`` moves the stored tsvectors over and fills the counts.
    3: [
        "ALTER TABLE {p}sessions ADD COLUMN IF NOT EXISTS search_key bigserial",
        "ALTER TABLE {p}sessions ADD COLUMN IF NOT EXISTS search_docs bigint NOT NULL DEFAULT 0",
        "ALTER TABLE {p}sessions ADD COLUMN IF NOT EXISTS search_length double precision"
        " NOT NULL DEFAULT 0",
        """CREATE TABLE IF NOT EXISTS {p}search_docs (
            search_key bigint NOT NULL,
            seq        bigint NOT NULL,
            role       text NOT NULL,
            length     double precision NOT NULL,
            search     tsvector NOT NULL,
            PRIMARY KEY (search_key, seq)
        )""",
        # No pending list: every search reads several posting lists, none has to scan one (new
        # entries go straight into the index, at some cost to appends).
        "CREATE INDEX IF NOT EXISTS search_docs_search ON {p}search_docs USING gin (search)"
        " WITH (fastupdate = off)",
        """CREATE TABLE IF NOT EXISTS {p}search_terms (
            search_key bigint NOT NULL,
            term       text NOT NULL,
            df         bigint NOT NULL,
            PRIMARY KEY (search_key, term)
        )""",
    ],
    # 4 -> 5: an inverted index of our own instead of the GIN index (whose every posting read
    # cost a visit to a wide row): each term of a session gets an id, and ``search_postings``
    # holds its postings in blocks of 64 seqs (``block`` = seq >> 6, bit seq & 63 of ``bits``),
    # so a term's postings are read in order from the primary key alone (index-only scans), and
    # a message's role is one more term (see ``_role_term``). ``search_entries`` keeps what
    # each message is indexed under (its own terms, the lent ones; space-joined), for scoring
    # and for removing it. ``_convert_search`` moves the stored entries over; ``search_docs``
    # and the GIN index go. Index-only scans skip the heap only on pages the visibility map
    # marks all-visible, and every append rewrites the current block of each of its terms:
    # autovacuum visits the postings after 1% of them changed (by default 20%).
    4: [
        "ALTER TABLE {p}search_terms ADD COLUMN IF NOT EXISTS id bigserial",
        "CREATE UNIQUE INDEX IF NOT EXISTS search_terms_id ON {p}search_terms (id)",
        """CREATE TABLE IF NOT EXISTS {p}search_entries (
            search_key bigint NOT NULL,
            seq        bigint NOT NULL,
            terms      text NOT NULL,
            context    text NOT NULL,
            PRIMARY KEY (search_key, seq)
        )""",
        """CREATE TABLE IF NOT EXISTS {p}search_postings (
            term_id bigint NOT NULL,
            block   bigint NOT NULL,
            bits    bigint NOT NULL,
            PRIMARY KEY (term_id, block) INCLUDE (bits)
        ) WITH (autovacuum_vacuum_scale_factor = 0.01,
            autovacuum_vacuum_insert_scale_factor = 0.01)""",
    ],
}

#: Schema 2-3's tsvector of a message (its own terms in weight class A, the lent ones in B, no
#: session key): what the migration to schema 2 fills in, and the migration to 5 converts.
_LEGACY_TSVECTOR = (
    "setweight(to_tsvector('simple', {own}), 'A') || setweight(to_tsvector('simple', {lent}), 'B')"
)
#: Entries converted per statement by the migration to schema 5.
_CONVERT_BATCH = 5000
