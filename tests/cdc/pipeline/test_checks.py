from cdc.pipeline.sql_text import sql_tables


def test_sql_tables_are_the_names_after_from_and_join():
    sql = """
        WITH recent AS (SELECT * FROM events WHERE time > now() - INTERVAL 1 DAY), top AS (SELECT 1)
        SELECT p.*, 'FROM strings' FROM players p  -- FROM comments
        LEFT JOIN recent r ON r.player = p.player JOIN `odd_name` o /* JOIN hidden */ ON true
        CROSS JOIN range(10) JOIN delta.`/tmp/x` d ON true JOIN (SELECT * FROM scores) s ON true
    """
    assert sql_tables(sql) == {"events", "players", "odd_name", "scores"}
