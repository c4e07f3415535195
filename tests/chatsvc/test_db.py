"""The database layer on SQLite and Postgres: migrations, the session manager's queries, crash recovery."""

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from chatsvc import chat_sessions, crud
from chatsvc.db import alembic_config, create_db_engine, migrate
from chatsvc.errors import Conflict, NotFound
from chatsvc.models import Base, MessageStatus, Role
from chatsvc.security import verify_password

CHAT_TABLES = {table.name for table in Base.metadata.sorted_tables}


def test_migrations_upgrade_downgrade_and_upgrade_again(db_url):
    engine = create_db_engine(db_url)
    migrate(engine)
    assert set(inspect(engine).get_table_names()) >= CHAT_TABLES
    with engine.begin() as connection:
        heads = MigrationContext.configure(connection).get_current_heads()
        command.downgrade(alembic_config(connection), "-1")
        assert MigrationContext.configure(connection).get_current_heads() != heads
    migrate(engine)
    with engine.begin() as connection:  # and all the way down, and up again
        command.downgrade(alembic_config(connection), "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    migrate(engine)
    assert set(inspect(engine).get_table_names()) >= CHAT_TABLES
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_heads() == heads
        # The migrations create exactly what the models describe (other parts' tables aside).
        only_ours = {"include_name": lambda name, kind, parent: kind != "table" or name in CHAT_TABLES}
        assert compare_metadata(MigrationContext.configure(connection, opts=only_ours), Base.metadata) == []
    engine.dispose()


def test_embeddings_made_before_encoders_were_recorded_are_marked_minilm(db_url):
    engine = create_db_engine(db_url)
    migrate(engine)
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0005")
        connection.execute(
            text(
                "INSERT INTO retrieval_documents (id, collection, name, kind, num_bytes, created_at) "
                "VALUES (1, 'kb:old', 'a.md', 'markdown', 5, CURRENT_TIMESTAMP)"
            )
        )
        connection.execute(text("INSERT INTO retrieval_sections VALUES (1, 1, NULL, 0, 0, '')"))
        connection.execute(
            text("INSERT INTO retrieval_paragraphs VALUES (1, 'kb:old', 1, 1, 0, '', 'hi', :ends, :vector)"),
            {"ends": "[5]", "vector": b"\0" * 1536},
        )
    migrate(engine)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT name, encoder FROM retrieval_collections")).all() == [
            ("kb:old", "minilm")
        ]
        assert connection.scalar(text("SELECT encoder FROM retrieval_paragraphs")) == "minilm"
    engine.dispose()


def test_first_admin_is_created_once_and_follows_the_settings_key_and_password(database):
    with database.begin() as db:
        admin, generated, password = crud.ensure_first_admin(db, api_key=None, password=None)
        assert admin.role == Role.admin and generated.startswith("kvc-")
    with database.begin() as db:
        assert crud.user_by_api_key(db, generated).username == "admin"
        assert crud.user_by_password(db, "admin", password).username == "admin"
        _, key_again, password_again = crud.ensure_first_admin(
            db, api_key="kvc-chosen", password="s3cret-pass"
        )
        assert key_again is None and password_again is None
    with database.begin() as db:
        assert crud.user_by_api_key(db, "kvc-chosen").username == "admin"
        assert crud.user_by_api_key(db, "kvc-wrong") is None
        assert verify_password("s3cret-pass", crud.list_users(db)[0].password_hash)
        assert len(crud.list_users(db)) == 1
        with pytest.raises(Conflict, match="exists already"):
            crud.create_user(db, "admin")


def test_sessions_list_pinned_first_then_newest_and_search_titles_and_text(database):
    with database.begin() as db:
        alice, bob = crud.create_user(db, "alice"), crud.create_user(db, "bob")
        first = chat_sessions.create_session(db, alice, title="Trip to Kyoto")
        second = chat_sessions.create_session(db, alice, title="Recipes")
        crud.add_message(db, second, None, "user", "How long to bake 100% rye_bread?")
        third = chat_sessions.create_session(db, alice, title="Taxes")
        crud.add_message(db, third, None, "user", "退货需要多长时间？")
        chat_sessions.update_session(db, first, {"pinned": True})
        chat_sessions.create_session(db, bob, title="Bob's Kyoto notes")
    with database.begin() as db:
        listed, total = crud.list_sessions(db, alice.id)
        assert [s.id for s in listed] == [first.id, third.id, second.id] and total == 3
        assert [s.id for s in crud.list_sessions(db, alice.id, search="kyoto")[0]] == [first.id]
        assert [s.id for s in crud.list_sessions(db, alice.id, search="100% RYE_")[0]] == [second.id]
        assert crud.list_sessions(db, alice.id, search="100%%")[1] == 0  # % and _ match literally
        assert [s.id for s in crud.list_sessions(db, alice.id, search="退货")[0]] == [third.id]
        chat_sessions.update_session(db, crud.find_session(db, alice.id, third.id), {"archived": True})
        assert third.id not in [s.id for s in crud.list_sessions(db, alice.id)[0]]
        assert [s.id for s in crud.list_sessions(db, alice.id, archived=True)[0]] == [third.id]
        assert crud.list_sessions(db, None, archived=None)[1] == 4  # the admin's view


def test_lookups_are_scoped_to_the_owner(database):
    with database.begin() as db:
        alice, bob = crud.create_user(db, "alice"), crud.create_user(db, "bob")
        session = chat_sessions.create_session(db, alice)
        message = crud.add_message(db, session, None, "user", "hello")
        knowledge_base = crud.create_knowledge_base(db, alice.id, "manuals")
    with database.begin() as db:
        assert crud.find_session(db, alice.id, session.id).id == session.id
        assert crud.find_message(db, alice.id, message.id).id == message.id
        with pytest.raises(NotFound):
            crud.find_session(db, bob.id, session.id)
        with pytest.raises(NotFound):
            crud.find_message(db, bob.id, message.id)
        with pytest.raises(NotFound):
            crud.find_knowledge_base(db, bob.id, knowledge_base.id)
        with pytest.raises(NotFound):  # bob cannot attach alice's knowledge base to his session
            chat_sessions.create_session(db, bob, knowledge_base_id=knowledge_base.id)


def test_branches_follow_parent_ids_and_the_newest_message_is_the_active_tip(database):
    with database.begin() as db:
        owner = crud.create_user(db, "alice")
        session = chat_sessions.create_session(db, owner)
        question = crud.add_message(db, session, None, "user", "Q1")
        crud.add_message(db, session, question.id, "assistant", "A1")
        regenerated = crud.add_message(db, session, question.id, "assistant", "A1 again")
        follow_up = crud.add_message(db, session, regenerated.id, "user", "Q2")
    with database.begin() as db:
        assert [m.content for m in crud.branch(db, session.id)] == ["Q1", "A1 again", "Q2"]
        assert [m.content for m in crud.branch(db, session.id, question.id)] == ["Q1"]
        assert len(crud.session_messages(db, session.id)) == 4
        with pytest.raises(Conflict, match="system prompt"):
            chat_sessions.update_session(
                db, crud.find_session(db, owner.id, session.id), {"system_prompt": "new"}
            )
        crud.delete_session(db, crud.find_session(db, owner.id, session.id))
    with database.begin() as db, pytest.raises(NotFound):
        crud.find_message(db, owner.id, follow_up.id)  # deleted with its session


def test_startup_recovery_marks_only_this_replicas_unfinished_replies_interrupted(database):
    with database.begin() as db:
        owner = crud.create_user(db, "alice")
        session = chat_sessions.create_session(db, owner)
        question = crud.add_message(db, session, None, "user", "Q")
        mine = crud.add_message(db, session, question.id, "assistant", "", status="pending", replica_id="a")
        crud.save_reply_progress(db, mine.id, "partial answ")
        other = crud.add_message(db, session, question.id, "assistant", "", status="pending", replica_id="b")
    with database.begin() as db:
        assert crud.mark_interrupted(db, "a") == 1
    with database.begin() as db:
        recovered = crud.find_message(db, owner.id, mine.id)
        assert (recovered.status, recovered.content) == (MessageStatus.interrupted, "partial answ")
        assert recovered.error and crud.find_message(db, owner.id, other.id).status == MessageStatus.pending
        assert crud.find_message(db, owner.id, question.id).content == "Q"
