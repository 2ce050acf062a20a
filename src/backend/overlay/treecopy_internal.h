/* treecopy_internal.h: what treecopy.c's walks take from treecopy_data.c,
 * the copy and comparison of one inode (its data and its metadata). */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

/* treecopy_data.c */
int treecopy_update_meta(int s, int d, const struct stat *st);
bool treecopy_special_same(int sfd, int dfd, const char *name, const struct stat *st);
int treecopy_refresh_data(int in, int out, off_t size, bool write, uint64_t *ret_written);
bool treecopy_same_data(int sfd, int dfd, const char *name, const struct stat *st);
