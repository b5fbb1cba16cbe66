import os

from _lib import Todo, expect, passed

t = Todo()
t.run("add", "Buy milk, eggs")
t.run("add", "Call mom")
t.run("done", "2")
code, exported, _ = t.run("export")
lines = exported.splitlines()
expect(code == 0 and lines[0] == "id,title,done,priority,due", "export starts with the header")
path = os.path.join(t.dir, "tasks.csv")
with open(path, "w") as f:
    f.write(exported)
other = Todo()
code, out, _ = other.run("import", path)
expect(code == 0 and out.strip() == "Imported 2", "import reads the file")
code, again, _ = other.run("export")
expect(again == exported, "a round trip keeps every field, a title with a comma included")
passed("F09")
