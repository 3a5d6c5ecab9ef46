-- The sample database for examples/backends/shop_agent.md (build it with make_shop_db.py).
CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT);
CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                    total REAL NOT NULL, placed_on TEXT NOT NULL);
CREATE TABLE staff_salaries(name TEXT, salary INTEGER);  -- not on the agent's allow-list
INSERT INTO customers VALUES (1, 'Ada', 'London'), (2, 'Grace', 'New York'), (3, 'Linus', 'Helsinki');
INSERT INTO orders VALUES (1, 1, 120.0, '2024-01-05'), (2, 1, 80.5, '2024-02-11'),
                          (3, 2, 42.0, '2024-02-12'), (4, 3, 310.0, '2024-03-01');
INSERT INTO staff_salaries VALUES ('Bob', 90000);
