"""Several ringrec.torch.HostEmbeddings of one process share the shared-memory directory's
free space (`embedding::share_among`, as `ringrec train --table`'s tables): each open
shares again among the tables open then, by their files' sizes, so two equal tables get
equal shares summing to about what one alone got (not twice it); a table with
`table_max_bytes` keeps its own; sizes given that cannot fit are a ValueError naming them,
on every rank. Prints `shares ok rank R`."""

import ringrec.torch as hvd
from checks import raises

hvd.init()
r = hvd.rank()
a = hvd.HostEmbedding(embedding_dim=4, table_capacity=4096, name="share.a")
slots, _, alone = a.size()
b = hvd.HostEmbedding(embedding_dim=4, table_capacity=4096, name="share.b")
sa, sb = a.size()[2], b.size()[2]
assert sa == sb, "equal tables, unequal shares: %d, %d" % (sa, sb)
# The free space moves with what other jobs hold; two shares must not be twice one.
assert sa < alone and sa + sb <= alone * 1.05, "shares %d + %d against %d alone" % (sa, sb, alone)
own = 8 << 20
c = hvd.HostEmbedding(embedding_dim=4, table_capacity=4096, table_max_bytes=own, name="share.c")
assert c.size()[2] == own, c.size()
assert a.size()[2] <= sa, "a table opened later lowers the others' shares: %d > %d" % (a.size()[2], sa)
raises(ValueError, ['HostEmbedding "share.d" table_max_bytes=%d' % (1 << 60), "table_max_bytes=%d" % own, "lower them"],
       lambda: hvd.HostEmbedding(embedding_dim=4, table_capacity=4096, table_max_bytes=1 << 60, name="share.d"))
# The refused table is not open: its name is free again, and the others still work.
d = hvd.HostEmbedding(embedding_dim=4, table_capacity=4096, name="share.d")
for t in (a, b, c, d):
    t.close()
print("shares ok rank %d" % r, flush=True)
hvd.shutdown()
