/* oci_reg.c: the OCI distribution protocol over libcurl.
 *
 * One CURL handle per session keeps the connection alive between calls.
 * Every call goes through reg_call: on a 401 it reads the WWW-Authenticate
 * challenge, answers it (Basic with the auth file's entry, or a Bearer
 * token from the challenge's realm) and tries once more. Bodies come from
 * memory or a range of a file (pread, so a retry starts over); responses go
 * to memory (capped) or a file descriptor, hashed as they arrive.
 * Credentials live only in r->basic and r->auth and are never formatted
 * into a message. */
#include "engine/oci_reg.h"

#include <ctype.h>
#include <curl/curl.h>
#include <jansson.h>
#include <nettle/sha2.h>
#include <pthread.h>
#include <sys/stat.h>

#include "config.h"

#define MEM_MAX (4u << 20)
/* One PATCH: each is a request the registry resumes from its stored hash
 * state; with 16 MiB a 100 MB push of a made layer took up to 1.8x skopeo's
 * time against 1.1x to 1.3x in one PATCH (bench/registry.py, load 10). */
#define CHUNK (1024ull << 20)
#define FLUSH_EVERY (8u << 20)
/* Large buffers: fewer calls and system calls per blob (curl's maxima) */
#define RECV_BUF (512L * 1024)
#define SEND_BUF (2L * 1024 * 1024)

struct oci_reg {
	const struct config *cfg;
	struct oci_ref ref;
	char origin[300]; /* scheme://host */
	char scope[300];
	char *basic; /* "Basic ..." from the auth file, or NULL */
	char *auth;  /* the Authorization value in use, or NULL */
	CURL *c;
};

struct reg_call {
	const char *method, *url, *ctype, *accept;
	const char *body;
	size_t body_len;
	int in_fd;
	uint64_t in_off, in_len, in_pos;
	const struct oci_reg_source *src; /* a body still being written, or NULL */
	int src_err;                      /* its writer failed: the body ended early */
	int out_fd;
	char *mem;
	size_t mem_len;
	struct sha256_ctx h;
	int64_t got, max;
	uint64_t flushed; /* bytes of out_fd whose writeback was started */
	bool over;
	int werr;
	void (*on_bytes)(void *arg, uint64_t n);
	void *arg;
	int (*sink)(void *arg, const void *buf, size_t len); /* a blob's bytes, instead of out_fd */
	long status, hstatus; /* hstatus: the status line of the response whose body arrives */
	char location[2048], challenge[1024], rtype[128], rdigest[80], range[64];
};

static bool host_ok(const char *h)
{
	if (!*h || strlen(h) > 255)
		return false;
	for (const char *p = h; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr(".-:[]", *p))
			return false;
	return strchr(h, '.') || strchr(h, ':') || !strcmp(h, "localhost");
}

static bool repo_ok(const char *r)
{
	if (!*r || strlen(r) > 255 || *r == '/' || r[strlen(r) - 1] == '/' || strstr(r, "//"))
		return false;
	for (const char *p = r; *p; p++)
		if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) || strchr("._-/", *p)))
			return false;
	return true;
}

bool oci_tag_valid(const char *t)
{
	size_t n = strlen(t);
	if (n == 0 || n > 128 || !(isalnum((unsigned char)t[0]) || t[0] == '_'))
		return false;
	for (size_t i = 1; i < n; i++)
		if (!isalnum((unsigned char)t[i]) && !strchr("._-", t[i]))
			return false;
	return true;
}

static bool digest_ok(const char *d)
{
	if (strncmp(d, "sha256:", 7) || strlen(d) != 7 + 64)
		return false;
	for (const char *p = d + 7; *p; p++)
		if (!isdigit((unsigned char)*p) && !(*p >= 'a' && *p <= 'f'))
			return false;
	return true;
}

int oci_ref_parse(const char *s, struct oci_ref *r, ckpt_error *err)
{
	char buf[700];
	memset(r, 0, sizeof(*r));
	if (!s || strlen(s) >= sizeof(buf))
		goto bad;
	snprintf(buf, sizeof(buf), "%s", s);
	char *at = strchr(buf, '@');
	if (at) {
		*at = '\0';
		if (!digest_ok(at + 1))
			goto bad;
		snprintf(r->digest, sizeof(r->digest), "%s", at + 1);
	}
	char *slash = strchr(buf, '/');
	if (!slash)
		goto bad;
	*slash = '\0';
	char *repo = slash + 1, *colon = strrchr(repo, ':');
	if (colon) {
		*colon = '\0';
		if (!oci_tag_valid(colon + 1))
			goto bad;
		snprintf(r->tag, sizeof(r->tag), "%s", colon + 1);
	}
	if (!host_ok(buf) || !repo_ok(repo))
		goto bad;
	snprintf(r->host, sizeof(r->host), "%.255s", buf); /* host_ok and repo_ok bound both */
	snprintf(r->repo, sizeof(r->repo), "%.255s", repo);
	return 0;
bad:
	return err_set_kind(
		err, ERR_INVALID, EINVAL, "invalid_ref",
		"ref must be HOST[:PORT]/REPO[:TAG] or HOST[:PORT]/REPO@sha256:HEX (lower-case repository)");
}

/* The auth file's "auth" for host: containers-auth.json(5) and Docker's
 * config.json both keep {"auths": {"HOST": {"auth": base64(user:pass)}}};
 * Docker may write the key as a URL. */
static char *reg_basic(const struct config *cfg, const char *host)
{
	if (!cfg->registry_auth_file)
		return NULL;
	json_auto_t *root = json_load_file(cfg->registry_auth_file, 0, NULL);
	json_t *auths = json_object_get(root, "auths"), *v;
	const char *k;
	json_object_foreach (auths, k, v) {
		const char *h = k;
		if (!strncmp(h, "https://", 8))
			h += 8;
		else if (!strncmp(h, "http://", 7))
			h += 7;
		size_t n = strcspn(h, "/");
		const char *a = json_string_value(json_object_get(v, "auth"));
		char *out;
		if (strlen(host) == n && !strncmp(h, host, n) && a && *a)
			return asprintf(&out, "Basic %s", a) < 0 ? NULL : out;
	}
	return NULL;
}

static bool insecure(const struct config *cfg, const char *host)
{
	for (size_t i = 0; i < cfg->n_registry_insecure; i++)
		if (!strcmp(cfg->registry_insecure[i], host))
			return true;
	return false;
}

static void reg_global_init(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

int oci_reg_open(const struct config *cfg, const struct oci_ref *ref, const char *scope, struct oci_reg **ret,
		 ckpt_error *err)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, reg_global_init);
	struct oci_reg *r = calloc(1, sizeof(*r));
	if (!r || !(r->c = curl_easy_init())) {
		free(r);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	r->cfg = cfg;
	r->ref = *ref;
	snprintf(r->origin, sizeof(r->origin), "%s://%s", insecure(cfg, ref->host) ? "http" : "https", ref->host);
	snprintf(r->scope, sizeof(r->scope), "repository:%s:%s", ref->repo, scope);
	r->basic = reg_basic(cfg, ref->host);
	*ret = r;
	return 0;
}

void oci_reg_free(struct oci_reg *r)
{
	if (!r)
		return;
	curl_easy_cleanup(r->c);
	if (r->basic)
		explicit_bzero(r->basic, strlen(r->basic));
	if (r->auth)
		explicit_bzero(r->auth, strlen(r->auth));
	free(r->basic);
	free(r->auth);
	free(r);
}

static size_t on_header(char *b, size_t sz, size_t n, void *arg)
{
	struct reg_call *q = arg;
	size_t len = sz * n, k;
	const char *sp = len > 5 && !strncmp(b, "HTTP/", 5) ? memchr(b, ' ', len) : NULL;
	if (sp) /* the line ends with CRLF: strtol stops there */
		q->hstatus = strtol(sp + 1, NULL, 10);
	struct {
		const char *name;
		char *dst;
		size_t cap;
	} want[] = {
		{ "location:", q->location, sizeof(q->location) },
		{ "www-authenticate:", q->challenge, sizeof(q->challenge) },
		{ "content-type:", q->rtype, sizeof(q->rtype) },
		{ "docker-content-digest:", q->rdigest, sizeof(q->rdigest) },
		{ "range:", q->range, sizeof(q->range) },
	};
	for (size_t i = 0; i < ARRAY_SIZE(want); i++) {
		size_t nl = strlen(want[i].name);
		if (len <= nl || strncasecmp(b, want[i].name, nl))
			continue;
		const char *v = b + nl;
		size_t vl = len - nl;
		while (vl && (*v == ' ' || *v == '\t'))
			v++, vl--;
		while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
			vl--;
		k = vl < want[i].cap - 1 ? vl : want[i].cap - 1;
		memcpy(want[i].dst, v, k);
		want[i].dst[k] = '\0';
	}
	return len;
}

static size_t on_body(char *b, size_t sz, size_t n, void *arg)
{
	struct reg_call *q = arg;
	size_t len = sz * n;
	if (q->max >= 0 && q->got + (int64_t)len > q->max) {
		q->over = true;
		return 0;
	}
	q->got += (int64_t)len;
	/* only a 200's body is the blob: a 401's or 404's stays in memory */
	if (q->sink && q->hstatus == 200) {
		sha256_update(&q->h, len, (const uint8_t *)b);
		int k = q->sink(q->arg, b, len);
		if (k < 0)
			q->werr = -k;
		return k < 0 ? 0 : len;
	}
	if (q->out_fd >= 0 && q->hstatus == 200) {
		sha256_update(&q->h, len, (const uint8_t *)b);
		for (size_t done = 0; done < len;) {
			ssize_t k = write(q->out_fd, b + done, len - done);
			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0) {
				q->werr = errno;
				return 0;
			}
			done += (size_t)k;
		}
		if ((uint64_t)q->got - q->flushed >= FLUSH_EVERY) { /* the fsync before keeping it waits less */
			sync_file_range(q->out_fd, (off_t)q->flushed, (off_t)((uint64_t)q->got - q->flushed),
					SYNC_FILE_RANGE_WRITE);
			q->flushed = (uint64_t)q->got;
		}
		if (q->on_bytes)
			q->on_bytes(q->arg, len);
		return len;
	}
	char *m = realloc(q->mem, q->mem_len + len + 1);
	if (!m)
		return 0;
	q->mem = m;
	memcpy(m + q->mem_len, b, len);
	q->mem_len += len;
	m[q->mem_len] = '\0';
	return len;
}

static size_t on_read(char *b, size_t sz, size_t n, void *arg)
{
	struct reg_call *q = arg;
	size_t len = sz * n;
	uint64_t left = q->in_len - q->in_pos;
	if (left < len)
		len = (size_t)left;
	if (len == 0)
		return 0;
	ssize_t k = pread(q->in_fd, b, len, (off_t)(q->in_off + q->in_pos));
	if (k <= 0) {
		q->werr = k < 0 ? errno : EIO;
		return CURL_READFUNC_ABORT;
	}
	q->in_pos += (uint64_t)k;
	if (q->on_bytes)
		q->on_bytes(q->arg, (uint64_t)k);
	return (size_t)k;
}

/* A body whose length is not known yet: what the source has, as it comes. */
static size_t on_stream(char *b, size_t sz, size_t n, void *arg)
{
	struct reg_call *q = arg;
	ssize_t k = q->src->read(q->src->arg, b, sz * n);
	if (k < 0) { /* end the body well: the answer's Location still closes the session */
		q->src_err = (int)-k;
		return 0;
	}
	return (size_t)k;
}

/* One request, once. */
static int reg_once(struct oci_reg *r, struct reg_call *q, ckpt_error *err)
{
	CURL *c = r->c;
	struct curl_slist *h = NULL;
	char line[2400];
	curl_easy_reset(c);
	q->status = q->hstatus = 0;
	q->location[0] = q->challenge[0] = q->rtype[0] = q->rdigest[0] = q->range[0] = '\0';
	q->got = 0;
	q->flushed = 0;
	q->in_pos = 0;
	free(q->mem);
	q->mem = NULL;
	q->mem_len = 0;
	sha256_init(&q->h);
	curl_easy_setopt(c, CURLOPT_URL, q->url);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, !strcmp(q->method, "GET") ? 1L : 0L);
	curl_easy_setopt(c, CURLOPT_UNRESTRICTED_AUTH, 0L); /* no credentials to a redirect's host */
	if (r->cfg->registry_ca_file)
		curl_easy_setopt(c, CURLOPT_CAINFO, r->cfg->registry_ca_file);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, q);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, q);
	if (q->out_fd >= 0 || q->sink)
		curl_easy_setopt(c, CURLOPT_BUFFERSIZE, RECV_BUF);
	if (!strcmp(q->method, "HEAD")) {
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	} else if (q->body) {
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
		h = curl_slist_append(h, "Expect:");
	} else if (q->in_fd >= 0) { /* a range of a file, read as curl sends */
		curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_UPLOAD_BUFFERSIZE, SEND_BUF);
		curl_easy_setopt(c, CURLOPT_READDATA, q);
		curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->in_len);
		h = curl_slist_append(h, "Expect:");
		snprintf(line, sizeof(line), "Content-Range: %llu-%llu", (unsigned long long)q->in_off,
			 (unsigned long long)(q->in_off + q->in_len - 1));
		h = curl_slist_append(h, line);
	} else if (q->src) { /* chunked transfer encoding: the length is known at the end */
		curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_stream);
		curl_easy_setopt(c, CURLOPT_UPLOAD_BUFFERSIZE, SEND_BUF);
		curl_easy_setopt(c, CURLOPT_READDATA, q);
		curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)-1);
		h = curl_slist_append(h, "Expect:");
		h = curl_slist_append(h, "Transfer-Encoding: chunked");
	} else if (strcmp(q->method, "GET")) {
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
	}
	if (q->ctype && snprintf(line, sizeof(line), "Content-Type: %s", q->ctype) < (int)sizeof(line))
		h = curl_slist_append(h, line);
	if (q->accept && snprintf(line, sizeof(line), "Accept: %s", q->accept) < (int)sizeof(line))
		h = curl_slist_append(h, line);
	if (r->auth && snprintf(line, sizeof(line), "Authorization: %s", r->auth) < (int)sizeof(line))
		h = curl_slist_append(h, line);
	explicit_bzero(line, sizeof(line));
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	CURLcode rc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &q->status);
	curl_slist_free_all(h);
	if (q->over)
		return err_set_kind(err, ERR_UPSTREAM, EFBIG, "size_mismatch",
				    "registry %s sent more than %lld bytes for %s", r->ref.host, (long long)q->max,
				    q->url + strlen(r->origin));
	if (q->werr)
		return err_set(err, q->werr, NULL, "transfer with registry %s: %s", r->ref.host, strerror(q->werr));
	if (rc != CURLE_OK)
		return err_set_kind(err, ERR_UPSTREAM, EHOSTUNREACH, "registry_unreachable",
				    "registry %s unreachable: %s", r->ref.host, curl_easy_strerror(rc));
	return 0;
}

/* The value of key="..." in a challenge. */
static bool chal_param(const char *chal, const char *key, char *out, size_t cap)
{
	size_t kl = strlen(key);
	for (const char *p = chal; (p = strcasestr(p, key)); p += kl) {
		if ((p != chal && !strchr(" ,", p[-1])) || p[kl] != '=' || p[kl + 1] != '"')
			continue;
		const char *v = p + kl + 2, *e = strchr(v, '"');
		if (!e || (size_t)(e - v) >= cap)
			return false;
		memcpy(out, v, (size_t)(e - v));
		out[e - v] = '\0';
		return true;
	}
	return false;
}

static int reg_token(struct oci_reg *r, const char *chal, ckpt_error *err)
{
	char realm[1024], service[256] = "", scope[600] = "", url[3000];
	if (!chal_param(chal, "realm", realm, sizeof(realm)) ||
	    (strncmp(realm, "https://", 8) && strncmp(realm, "http://", 7)))
		return err_set_kind(err, ERR_UPSTREAM, EPROTO, "registry_auth",
				    "registry %s sent a Bearer challenge without a usable realm", r->ref.host);
	chal_param(chal, "service", service, sizeof(service));
	if (!chal_param(chal, "scope", scope, sizeof(scope)) || !strstr(scope, r->ref.repo))
		snprintf(scope, sizeof(scope), "%s", r->scope);
	_cleanup_free_ char *es = curl_easy_escape(r->c, service, 0), *sc = curl_easy_escape(r->c, scope, 0);
	if (!es || !sc)
		return err_set(err, ENOMEM, NULL, "out of memory");
	snprintf(url, sizeof(url), "%s%cservice=%s&scope=%s", realm, strchr(realm, '?') ? '&' : '?', es, sc);
	char *keep = r->auth;
	r->auth = r->basic; /* the token endpoint takes the user's password */
	struct reg_call q = { .method = "GET", .url = url, .in_fd = -1, .out_fd = -1, .max = MEM_MAX };
	int rc = reg_once(r, &q, err);
	r->auth = keep;
	if (rc == 0 && q.status != 200)
		rc = err_set_kind(err, ERR_UPSTREAM, EACCES, "registry_unauthorized",
				  "the token service of registry %s refused (HTTP %ld)%s", r->ref.host, q.status,
				  r->basic ? "" : ": no credentials for it in the auth file");
	json_auto_t *j = rc == 0 ? json_loadb(q.mem ?: "", q.mem_len, 0, NULL) : NULL;
	const char *tok = json_string_value(json_object_get(j, "token"));
	if (!tok)
		tok = json_string_value(json_object_get(j, "access_token"));
	if (rc == 0 && !tok)
		rc = err_set_kind(err, ERR_UPSTREAM, EPROTO, "registry_auth",
				  "the token service of registry %s sent no token", r->ref.host);
	if (rc == 0) {
		free(r->auth);
		if (asprintf(&r->auth, "Bearer %s", tok) < 0)
			r->auth = NULL, rc = err_set(err, ENOMEM, NULL, "out of memory");
	}
	free(q.mem);
	return rc;
}

/* Answer the challenge of a 401: 1 to retry, 0 when there is nothing to
 * try (the 401 stands), <0 on error. */
static int reg_answer(struct oci_reg *r, const char *chal, ckpt_error *err)
{
	if (!strncasecmp(chal, "Bearer", 6)) {
		int q = reg_token(r, chal, err);
		return q < 0 ? q : 1;
	}
	if (!strncasecmp(chal, "Basic", 5) && r->basic && (!r->auth || strcmp(r->auth, r->basic))) {
		free(r->auth);
		r->auth = strdup(r->basic);
		return r->auth ? 1 : err_set(err, ENOMEM, NULL, "out of memory");
	}
	return 0;
}

/* A 401 or 403 that stands, as the error a client can act on. */
static int reg_denied(struct oci_reg *r, const struct reg_call *q, ckpt_error *err)
{
	if (q->status == 401)
		return err_set_kind(err, ERR_UPSTREAM, EACCES, "registry_unauthorized",
				    "registry %s answered 401 Unauthorized%s", r->ref.host,
				    r->basic ? ": check the credentials in the auth file"
					     : ": no credentials for it in the auth file");
	if (q->status == 403)
		return err_set_kind(err, ERR_UPSTREAM, EACCES, "registry_forbidden",
				    "registry %s answered 403 Forbidden for %s", r->ref.host, r->ref.repo);
	return 0;
}

static int reg_call(struct oci_reg *r, struct reg_call *q, ckpt_error *err)
{
	int rc = reg_once(r, q, err);
	if (rc == 0 && q->status == 401) {
		char chal[sizeof(q->challenge)];
		snprintf(chal, sizeof(chal), "%s", q->challenge);
		if ((rc = reg_answer(r, chal, err)) > 0)
			rc = reg_once(r, q, err);
	}
	return rc < 0 ? rc : reg_denied(r, q, err);
}

static int reg_unexpected(struct oci_reg *r, struct reg_call *q, const char *what, ckpt_error *err)
{
	json_auto_t *j = q->mem ? json_loads(q->mem, 0, NULL) : NULL;
	json_t *e0 = json_array_get(json_object_get(j, "errors"), 0);
	const char *code = json_string_value(json_object_get(e0, "code"));
	return err_set_kind(err, ERR_UPSTREAM, EPROTO, "registry_error", "registry %s: %s answered HTTP %ld%s%s",
			    r->ref.host, what, q->status, code ? " " : "", code ? code : "");
}

static void url_of(struct oci_reg *r, char *out, size_t cap, const char *kind, const char *what)
{
	snprintf(out, cap, "%s/v2/%s/%s/%s", r->origin, r->ref.repo, kind, what);
}

int oci_reg_blob_exists(struct oci_reg *r, const char *digest, bool *ret, ckpt_error *err)
{
	char url[700];
	url_of(r, url, sizeof(url), "blobs", digest);
	struct reg_call q = { .method = "HEAD", .url = url, .in_fd = -1, .out_fd = -1, .max = MEM_MAX };
	int rc = reg_call(r, &q, err);
	if (rc == 0 && q.status != 200 && q.status != 404)
		rc = reg_unexpected(r, &q, "HEAD blob", err);
	*ret = q.status == 200;
	free(q.mem);
	return rc;
}

/* An upload URL the registry gave: absolute, or a path on its origin. */
static int abs_url(struct oci_reg *r, const char *loc, char *out, size_t cap, ckpt_error *err)
{
	if (!*loc)
		return err_set_kind(err, ERR_UPSTREAM, EPROTO, "registry_error", "registry %s gave no upload location",
				    r->ref.host);
	if (!strncmp(loc, "http://", 7) || !strncmp(loc, "https://", 8))
		snprintf(out, cap, "%s", loc);
	else
		snprintf(out, cap, "%s%s", r->origin, loc);
	return 0;
}

int oci_reg_blob_mount(struct oci_reg *r, const char *digest, const char *from, bool *ret, ckpt_error *err)
{
	char url[1200];
	_cleanup_free_ char *ef = curl_easy_escape(r->c, from, 0);
	snprintf(url, sizeof(url), "%s/v2/%s/blobs/uploads/?mount=%s&from=%s", r->origin, r->ref.repo, digest,
		 ef ? ef : "");
	struct reg_call q = { .method = "POST", .url = url, .body = "", .in_fd = -1, .out_fd = -1, .max = MEM_MAX };
	int rc = reg_call(r, &q, err);
	*ret = rc == 0 && q.status == 201;
	char del[2100];
	if (rc == 0 && q.status == 202 && abs_url(r, q.location, del, sizeof(del), NULL) == 0)
		oci_reg_upload_cancel(r, del); /* an upload was opened instead: close it */
	free(q.mem);
	return rc;
}

static void with_digest(char *url, size_t cap, const char *digest)
{
	size_t n = strlen(url);
	snprintf(url + n, cap - n, "%cdigest=%s", strchr(url, '?') ? '&' : '?', digest);
}

int oci_reg_upload_open(struct oci_reg *r, char *loc, size_t cap, ckpt_error *err)
{
	char url[700];
	snprintf(url, sizeof(url), "%s/v2/%s/blobs/uploads/", r->origin, r->ref.repo);
	struct reg_call q = { .method = "POST", .url = url, .body = "", .in_fd = -1, .out_fd = -1, .max = MEM_MAX };
	int rc = reg_call(r, &q, err);
	if (rc == 0 && q.status != 202)
		rc = reg_unexpected(r, &q, "start upload", err);
	if (rc == 0)
		rc = abs_url(r, q.location, loc, cap, err);
	free(q.mem);
	return rc;
}

/* PUT ?digest= with no body: the registry checks the bytes it got. */
static int upload_finish(struct oci_reg *r, char *loc, size_t cap, const char *digest, ckpt_error *err)
{
	with_digest(loc, cap, digest);
	struct reg_call p = { .method = "PUT",
			      .url = loc,
			      .ctype = "application/octet-stream",
			      .body = "",
			      .in_fd = -1,
			      .out_fd = -1,
			      .max = MEM_MAX };
	int rc = reg_call(r, &p, err);
	if (rc == 0 && p.status != 201)
		rc = reg_unexpected(r, &p, "finish upload", err);
	free(p.mem);
	return rc;
}

int oci_reg_upload_stream(struct oci_reg *r, const char *loc, const struct oci_reg_source *src, ckpt_error *err)
{
	char next[2100], digest[80];
	struct reg_call p = { .method = "PATCH",
			      .url = loc,
			      .ctype = "application/octet-stream",
			      .src = src,
			      .in_fd = -1,
			      .out_fd = -1,
			      .max = MEM_MAX };
	int rc = reg_once(r, &p, err); /* no second try: the bytes sent are not sent again */
	bool fresh = rc == 0 && p.status == 202 && abs_url(r, p.location, next, sizeof(next), NULL) == 0;
	if (rc == 0 && p.src_err)
		rc = err_set(err, p.src_err, NULL, "the layer was not made: %s", strerror(p.src_err));
	if (rc == 0)
		rc = reg_denied(r, &p, err);
	if (rc == 0 && !fresh)
		rc = p.status == 202 ? abs_url(r, p.location, next, sizeof(next), err)
				     : reg_unexpected(r, &p, "upload", err);
	free(p.mem);
	if (rc == 0) {
		char put[sizeof(next)]; /* upload_finish appends the digest */
		src->digest(src->arg, digest);
		snprintf(put, sizeof(put), "%s", next);
		if ((rc = upload_finish(r, put, sizeof(put), digest, err)) < 0)
			oci_reg_upload_cancel(r, next);
	} else {
		/* A registry refuses the session's first URL once it holds some of
		 * the bytes (distribution 2.8: "upload resumed at wrong offset"), and
		 * purges such sessions itself; a cut connection leaves no other. */
		oci_reg_upload_cancel(r, fresh ? next : loc);
	}
	return rc;
}

void oci_reg_upload_cancel(struct oci_reg *r, const char *loc)
{
	struct reg_call d = { .method = "DELETE", .url = loc, .in_fd = -1, .out_fd = -1, .max = MEM_MAX };
	reg_call(r, &d, NULL);
	free(d.mem);
}

int oci_reg_blob_upload(struct oci_reg *r, const char *path, const char *digest, uint64_t size,
			void (*on_bytes)(void *arg, uint64_t n), void *arg, ckpt_error *err)
{
	char loc[2100];
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return err_set(err, errno, NULL, "open layer '%s': %m", path);
	int rc = oci_reg_upload_open(r, loc, sizeof(loc), err);
	if (rc < 0)
		return rc;
	for (uint64_t off = 0; rc == 0 && off < size;) {
		uint64_t n = size - off < CHUNK ? size - off : CHUNK;
		struct reg_call p = { .method = "PATCH",
				      .url = loc,
				      .ctype = "application/octet-stream",
				      .in_fd = fd,
				      .in_off = off,
				      .in_len = n,
				      .out_fd = -1,
				      .max = MEM_MAX,
				      .on_bytes = on_bytes,
				      .arg = arg };
		rc = reg_call(r, &p, err);
		if (rc == 0 && p.status != 202)
			rc = reg_unexpected(r, &p, "upload chunk", err);
		if (rc == 0)
			rc = abs_url(r, p.location, loc, sizeof(loc), err);
		off += n;
		free(p.mem);
	}
	if (rc == 0)
		rc = upload_finish(r, loc, sizeof(loc), digest, err);
	if (rc < 0) /* the registry keeps nothing of it */
		oci_reg_upload_cancel(r, loc);
	return rc;
}

int oci_reg_manifest_put(struct oci_reg *r, const char *reference, const char *media_type, const char *body, size_t len,
			 ckpt_error *err)
{
	char url[700];
	url_of(r, url, sizeof(url), "manifests", reference);
	struct reg_call q = { .method = "PUT",
			      .url = url,
			      .ctype = media_type,
			      .body = body,
			      .body_len = len,
			      .in_fd = -1,
			      .out_fd = -1,
			      .max = MEM_MAX };
	int rc = reg_call(r, &q, err);
	if (rc == 0 && q.status != 201)
		rc = reg_unexpected(r, &q, "PUT manifest", err);
	free(q.mem);
	return rc;
}

static void hex_digest(struct sha256_ctx *h, char out[80])
{
	uint8_t d[SHA256_DIGEST_SIZE];
	sha256_digest(h, sizeof(d), d);
	strcpy(out, "sha256:");
	for (size_t i = 0; i < sizeof(d); i++)
		sprintf(out + 7 + 2 * i, "%02x", d[i]);
}

int oci_reg_manifest_get(struct oci_reg *r, const char *reference, char **body, size_t *len, char media_type[128],
			 char digest[80], ckpt_error *err)
{
	char url[700];
	url_of(r, url, sizeof(url), "manifests", reference);
	struct reg_call q = { .method = "GET",
			      .url = url,
			      .accept = OCI_MT_MANIFEST ", " OCI_MT_INDEX ", " DOCKER_MT_MANIFEST ", " DOCKER_MT_LIST,
			      .in_fd = -1,
			      .out_fd = -1,
			      .max = MEM_MAX };
	int rc = reg_call(r, &q, err);
	if (rc == 0 && q.status == 404)
		rc = err_set_kind(err, ERR_NOT_FOUND, ENOENT, "manifest_unknown",
				  "registry %s has no manifest %s in %s", r->ref.host, reference, r->ref.repo);
	else if (rc == 0 && q.status != 200)
		rc = reg_unexpected(r, &q, "GET manifest", err);
	if (rc < 0) {
		free(q.mem);
		return rc;
	}
	struct sha256_ctx h;
	sha256_init(&h);
	sha256_update(&h, q.mem_len, (const uint8_t *)(q.mem ?: ""));
	hex_digest(&h, digest);
	snprintf(media_type, 128, "%.*s", (int)strcspn(q.rtype, ";"), q.rtype);
	*body = q.mem ? q.mem : strdup("");
	*len = q.mem_len;
	return 0;
}

/* GET blob digest through q (out_fd or sink set), checked for size and
 * digest. */
static int blob_fetch(struct oci_reg *r, const char *digest, int64_t size, int64_t max, struct reg_call *q,
		      ckpt_error *err)
{
	char url[700], got[80];
	url_of(r, url, sizeof(url), "blobs", digest);
	q->method = "GET";
	q->url = url;
	q->in_fd = -1;
	q->max = size >= 0 ? size : max;
	int rc = reg_call(r, q, err);
	if (rc == 0 && q->status == 404)
		rc = err_set_kind(err, ERR_UPSTREAM, ENOENT, "blob_unknown", "registry %s has no blob %s in %s",
				  r->ref.host, digest, r->ref.repo);
	else if (rc == 0 && q->status != 200)
		rc = reg_unexpected(r, q, "GET blob", err);
	if (rc == 0 && size >= 0 && q->got != size)
		rc = err_set_kind(err, ERR_UPSTREAM, EBADMSG, "size_mismatch",
				  "blob %s is %lld bytes, the manifest says %lld", digest, (long long)q->got,
				  (long long)size);
	if (rc == 0) {
		hex_digest(&q->h, got);
		if (strcmp(got, digest))
			rc = err_set_kind(err, ERR_UPSTREAM, EBADMSG, "digest_mismatch",
					  "blob %s from registry %s has digest %s", digest, r->ref.host, got);
	}
	if (rc < 0 && size < 0 && q->over)
		rc = err_set_kind(err, ERR_LIMIT, EFBIG, "too_large", "blob %s is over the limit of %lld bytes", digest,
				  (long long)max);
	free(q->mem);
	return rc;
}

int oci_reg_blob_get(struct oci_reg *r, const char *digest, int64_t size, int64_t max, int fd,
		     void (*on_bytes)(void *arg, uint64_t n), void *arg, ckpt_error *err)
{
	struct reg_call q = { .out_fd = fd, .on_bytes = on_bytes, .arg = arg };
	return blob_fetch(r, digest, size, max, &q, err);
}

int oci_reg_blob_read(struct oci_reg *r, const char *digest, int64_t size, int64_t max,
		      int (*sink)(void *arg, const void *buf, size_t len), void *arg, ckpt_error *err)
{
	struct reg_call q = { .out_fd = -1, .sink = sink, .arg = arg };
	return blob_fetch(r, digest, size, max, &q, err);
}
