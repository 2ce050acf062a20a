/* overlay_running.c: <state>/overlay/running, on disk while ckptd runs. A
 * start that finds it knows the last run ended by a kill or a power cut,
 * and trusts no upper's index (idx/index).
 *
 * Why: a create links from the last layer, instead of copying, each file
 * whose inode, size and ctime are as the upper's index recorded them.
 * fdatasync makes a rewrite's data durable but not its new ctime, as
 * databases rely on; after a power cut such a file has new data and the
 * ctime the index holds. The index is durable by then (a create's syncfs
 * covers it), so a create would link the old data. */
#include <sys/stat.h>

#include "backend/overlay/overlay_internal.h"
#include "lib/failpoint.h"

#define OVL_RUNNING "running"

void overlay_running_open(struct ovl *o)
{
	struct stat st;
	o->index_distrust = fstatat(o->odir_fd, OVL_RUNNING, &st, AT_SYMLINK_NOFOLLOW) == 0;
	if (o->index_distrust) {
		log_notice("overlay: the last run did not end cleanly: no upper's index is trusted, and each "
			   "root's next create copies its upper's files instead of linking them");
		return;
	}
	int q = FAILPOINT_AROUND("overlay.running.write", write_file_atomic(o->odir_fd, OVL_RUNNING, "", 0, 0600));
	if (q < 0) {
		/* A crash of this run would leave no trace: no index read, none saved */
		o->index_distrust = o->index_unsaved = true;
		log_warn("overlay: cannot write '%s/%s': %s: upper indexes are not used this run", o->odir, OVL_RUNNING,
			 strerror(-q));
	}
}

/* A clean stop: the uppers and their indexes durable as ckptd last saw
 * them (a syncfs of the state dir's file system), then the marker goes.
 * If that syncfs fails, the marker stays and the next start trusts no
 * index. */
void overlay_running_close(struct ovl *o)
{
	if (o->odir_fd < 0 || o->index_unsaved || syncfs(o->odir_fd) < 0)
		return;
	if (FAILPOINT_AROUND("overlay.running.unlink", unlinkat(o->odir_fd, OVL_RUNNING, 0)) == 0)
		fsync(o->odir_fd);
}
