import logging
from logging.config import fileConfig

from flask import current_app

from alembic import context

# this is the Alembic Config object, which provides
# access to the values within the .ini file in use.
config = context.config

# Interpret the config file for Python logging.
# This line sets up loggers basically.
fileConfig(config.config_file_name, disable_existing_loggers=False)
logger = logging.getLogger('alembic.env')


def get_engine():
    try:
        # this works with Flask-SQLAlchemy<3 and Alchemical
        return current_app.extensions['migrate'].db.engine
    except (TypeError, AttributeError):
        # this works with Flask-SQLAlchemy>=3
        return current_app.extensions['migrate'].db.engine


def get_engine_url():
    try:
        return get_engine().url.render_as_string(hide_password=False).replace(
            '%', '%%')
    except AttributeError:
        return str(get_engine().url).replace('%', '%%')


# add your model's MetaData object here
# for 'autogenerate' support
# from myapp import mymodel
# target_metadata = mymodel.Base.metadata
config.set_main_option('sqlalchemy.url', get_engine_url())
target_db = current_app.extensions['migrate'].db

# other values from the config, defined by the needs of env.py,
# can be acquired:
# my_important_option = config.get_main_option("my_important_option")
# ... etc.


def get_metadata():
    if hasattr(target_db, 'metadatas'):
        return target_db.metadatas[None]
    return target_db.metadata


def run_migrations_offline():
    """Run migrations in 'offline' mode.

    This configures the context with just a URL
    and not an Engine, though an Engine is acceptable
    here as well.  By skipping the Engine creation
    we don't even need a DBAPI to be available.

    Calls to context.execute() here emit the given string to the
    script output.

    """
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url, target_metadata=get_metadata(), literal_binds=True
    )

    with context.begin_transaction():
        context.run_migrations()


def render_item(type_, obj, autogen_context):
    """Render project column types as plain SQLAlchemy types, so migrations do not
    import application code."""
    from app.models.base import UTCDateTime

    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def include_name(name, type_, parent_names):
    """Autogenerate ignores the monthly partitions (their parent table is the model)."""
    from app.services.platform.partitions import is_partition

    return not (type_ == "table" and is_partition(name))


def install_functions(connection):
    """After a run that upgraded the database to the head revision (also when it was
    there already): every PostgreSQL function from its .sql file (app/sqlfunctions.py;
    docs/decisions.md, "PostgreSQL functions from .sql files"). Not after a downgrade, nor
    for commands that name no destination (current, check, autogenerate)."""
    from app import sqlfunctions

    migration = context.get_context()
    if migration.opts.get("destination_rev") is None:
        return
    if set(migration.get_current_heads()) != set(migration.opts["script"].get_heads()):
        return
    dropped = sqlfunctions.install(connection)
    logger.info("Installed the PostgreSQL functions from app/**/sql/*.sql%s",
                f"; dropped {', '.join(dropped)}" if dropped else "")


def run_migrations_online():
    """Run migrations in 'online' mode.

    In this scenario we need to create an Engine
    and associate a connection with the context.

    """

    # this callback is used to prevent an auto-migration from being generated
    # when there are no changes to the schema
    # reference: http://alembic.zzzcomputing.com/en/latest/cookbook.html
    def process_revision_directives(context, revision, directives):
        if getattr(config.cmd_opts, 'autogenerate', False):
            script = directives[0]
            if script.upgrade_ops.is_empty():
                directives[:] = []
                logger.info('No changes in schema detected.')

    conf_args = current_app.extensions['migrate'].configure_args
    if conf_args.get("process_revision_directives") is None:
        conf_args["process_revision_directives"] = process_revision_directives

    connectable = get_engine()

    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=get_metadata(),
            render_item=render_item,
            include_name=include_name,
            **conf_args
        )

        with context.begin_transaction():
            context.run_migrations()
            install_functions(connection)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
