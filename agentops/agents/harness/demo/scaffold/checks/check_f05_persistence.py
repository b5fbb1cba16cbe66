from _lib import Todo, expect, passed

t = Todo()
t.run("add", "Persist me")
code, out, _ = t.run("list")
expect(code == 0 and "1 [ ] Persist me" in out.splitlines(), "a second process sees the task")
with open(t.db, "w") as f:
    f.write("{not json")
code, _, err = t.run("list")
expect(code == 3 and err.strip() == "Corrupt database", "a corrupt database exits 3 with 'Corrupt database'")
with open(t.db) as f:
    expect(f.read() == "{not json", "the corrupt file is left untouched")
passed("F05")
