/* etcd_http.c: POSTs to etcd's v3 JSON gateway, over TLS and with etcd's
 * user authentication when configured (see etcd_http.h). Requests time out
 * quickly: a stalled etcd only delays renewal, and the watchdog (host.c)
 * keeps time on the owner's own clock. */
#include "host/etcd_http.h"

#include <pthread.h>

#define ETCD_TIMEOUT_MS 2000
#define ETCD_MAX_BODY (1 << 20)

struct etcd_http {
	char **endpoints;
	size_t n, cur; /* cur: the endpoint that answered last (under mu) */
	char *ca_file, *cert_file, *key_file, *user, *password;
	pthread_mutex_t mu;
	char *token;   /* etcd's auth token (under mu); NULL: none yet */
	char why[400]; /* the last failure, without credentials (under mu) */
};

/* What an answer that is not a success says, for what to do next. */
enum etcd_answer {
	ANSWER_OTHER,
	ANSWER_STALE_TOKEN, /* log in again and retry */
	ANSWER_BAD_LOGIN,   /* wrong user or password */
	ANSWER_NEEDS_USER,  /* etcd has auth on and we sent no token */
	ANSWER_DENIED,      /* the user's role does not cover the key */
};

size_t etcd_http_collect(char *data, size_t size, size_t nmemb, void *arg)
{
	struct etcd_http_buf *b = arg;
	size_t n = size * nmemb;
	char *p;

	if (b->len + n > ETCD_MAX_BODY || !(p = realloc(b->p, b->len + n + 1)))
		return 0;
	memcpy(p + b->len, data, n);
	b->p = p;
	b->len += n;
	p[b->len] = '\0';
	return n;
}

static void free_secret(char *s)
{
	if (s)
		explicit_bzero(s, strlen(s));
	free(s);
}

static void free_secretp(char **s)
{
	free_secret(*s);
}

static int dup_opt(char **dst, const char *s)
{
	return !s || (*dst = strdup(s)) ? 0 : -ENOMEM;
}

int etcd_http_new(const struct etcd_http_conf *conf, struct etcd_http **ret, ckpt_error *err)
{
	struct etcd_http *H = calloc(1, sizeof(*H));

	if (!H)
		return err_set(err, ENOMEM, NULL, "out of memory");
	pthread_mutex_init(&H->mu, NULL);
	if (!(H->endpoints = calloc(conf->n ? conf->n : 1, sizeof(char *))))
		goto nomem;
	for (size_t i = 0; i < conf->n; i++) {
		const char *e = conf->endpoints[i];
		if (strncmp(e, "http://", 7) && strncmp(e, "https://", 8)) {
			etcd_http_free(H);
			return err_set(err, EINVAL, NULL,
				       "etcd endpoint '%s': use http://HOST:PORT or https://HOST:PORT", e);
		}
		if (!(H->endpoints[i] = strdup(e)))
			goto nomem;
		H->n = i + 1;
		size_t len = strlen(H->endpoints[i]);
		if (len && H->endpoints[i][len - 1] == '/')
			H->endpoints[i][len - 1] = '\0';
	}
	if (dup_opt(&H->ca_file, conf->ca_file) < 0 || dup_opt(&H->cert_file, conf->cert_file) < 0 ||
	    dup_opt(&H->key_file, conf->key_file) < 0 || dup_opt(&H->user, conf->user) < 0 ||
	    dup_opt(&H->password, conf->password) < 0)
		goto nomem;
	*ret = H;
	return 0;
nomem:
	etcd_http_free(H);
	return err_set(err, ENOMEM, NULL, "out of memory");
}

void etcd_http_free(struct etcd_http *H)
{
	if (!H)
		return;
	for (size_t i = 0; i < H->n; i++)
		free(H->endpoints[i]);
	free(H->endpoints);
	free(H->ca_file), free(H->cert_file), free(H->key_file), free(H->user);
	free_secret(H->password);
	free_secret(H->token);
	pthread_mutex_destroy(&H->mu);
	free(H);
}

size_t etcd_http_endpoints(const struct etcd_http *H)
{
	return H->n;
}

/* A copy of the current token, or NULL. */
static char *token_get(struct etcd_http *H)
{
	pthread_mutex_lock(&H->mu);
	char *t = H->token ? strdup(H->token) : NULL;
	pthread_mutex_unlock(&H->mu);
	return t;
}

/* Drop the token if it is still `stale` (another thread may have renewed it). */
static void token_drop(struct etcd_http *H, const char *stale)
{
	pthread_mutex_lock(&H->mu);
	if (H->token && (!stale || !strcmp(H->token, stale))) {
		free_secret(H->token);
		H->token = NULL;
	}
	pthread_mutex_unlock(&H->mu);
}

static void why_set(struct etcd_http *H, const char *fmt, ...) _printf_(2, 3);
static void why_set(struct etcd_http *H, const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&H->mu);
	va_start(ap, fmt);
	vsnprintf(H->why, sizeof(H->why), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&H->mu);
}

void etcd_http_why(struct etcd_http *H, char *buf, size_t len)
{
	pthread_mutex_lock(&H->mu);
	snprintf(buf, len, "%s", H->why[0] ? H->why : "no answer");
	pthread_mutex_unlock(&H->mu);
}

/* Content type, and the token when we have one. */
static struct curl_slist *headers(const char *token)
{
	struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json"), *n;
	_cleanup_free_ char *auth = NULL;

	if (!h || !token)
		return h;
	if (asprintf(&auth, "Authorization: %s", token) < 0 || !(n = curl_slist_append(h, auth))) {
		curl_slist_free_all(h);
		h = NULL;
	} else {
		h = n;
	}
	if (auth)
		explicit_bzero(auth, strlen(auth));
	return h;
}

static CURL *easy(struct etcd_http *H, size_t at, const char *path, const char *body, struct curl_slist *hdr)
{
	_cleanup_free_ char *url = NULL;
	CURL *c;

	if (asprintf(&url, "%s%s", H->endpoints[at % H->n], path) < 0 || !(c = curl_easy_init()))
		return NULL;
	curl_easy_setopt(c, CURLOPT_URL, url); /* libcurl copies strings it is given */
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)ETCD_TIMEOUT_MS);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	/* over https etcd would offer HTTP/2: keep the gateway's HTTP/1.1 either way */
	curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	if (H->ca_file)
		curl_easy_setopt(c, CURLOPT_CAINFO, H->ca_file);
	if (H->cert_file) {
		curl_easy_setopt(c, CURLOPT_SSLCERT, H->cert_file);
		curl_easy_setopt(c, CURLOPT_SSLKEY, H->key_file);
	}
	return c;
}

/* The message of an error answer: the gateway's "error" or "message". */
static const char *answer_message(json_t *ans)
{
	json_t *e = json_object_get(ans, "error");
	if (json_is_object(e))
		e = json_object_get(e, "message");
	if (!json_is_string(e))
		e = json_object_get(ans, "message");
	return json_is_string(e) ? json_string_value(e) : NULL;
}

static enum etcd_answer answer_kind(const char *msg)
{
	if (!msg)
		return ANSWER_OTHER;
	if (strstr(msg, "invalid auth token") || strstr(msg, "revision of auth store is old"))
		return ANSWER_STALE_TOKEN;
	if (strstr(msg, "authentication failed"))
		return ANSWER_BAD_LOGIN;
	if (strstr(msg, "user name is empty"))
		return ANSWER_NEEDS_USER;
	return strstr(msg, "permission denied") ? ANSWER_DENIED : ANSWER_OTHER;
}

static const char *answer_hint(struct etcd_http *H, enum etcd_answer k)
{
	switch (k) {
	case ANSWER_BAD_LOGIN:
		return " (etcd refused the user name or password: check etcd_user and etcd_password_file)";
	case ANSWER_NEEDS_USER:
		return H->user ? "" : " (etcd has authentication enabled: set etcd_user and etcd_password_file)";
	case ANSWER_DENIED:
		return " (give etcd_user a role with readwrite on the key prefix /ckptd/)";
	default:
		return "";
	}
}

/* What to try about a TLS failure, from libcurl's code and message. With
 * TLS 1.3 etcd refuses a client certificate after the handshake: the alert
 * or only a reset reaches us, depending on timing. */
static const char *tls_hint(const char *url, CURLcode cr, const char *detail)
{
	bool tls = !strncmp(url, "https://", 8);

	if (cr == CURLE_PEER_FAILED_VERIFICATION || strstr(detail, "certificate problem"))
		return " (is etcd_ca_file the CA that signed etcd's certificate?)";
	if (cr == CURLE_SSL_CACERT_BADFILE)
		return " (check etcd_ca_file)";
	if (cr == CURLE_SSL_CERTPROBLEM)
		return " (check etcd_cert_file and etcd_key_file)";
	if (strstr(detail, "certificate required") || strstr(detail, "bad certificate") || strstr(detail, "unknown ca"))
		return " (etcd did not accept our client certificate: check etcd_cert_file and etcd_key_file)";
	if (tls && (cr == CURLE_SEND_ERROR || cr == CURLE_RECV_ERROR || cr == CURLE_GOT_NOTHING))
		return " (etcd closed the connection after the TLS handshake: does it accept our client "
		       "certificate? check etcd_cert_file and etcd_key_file)";
	return "";
}

/* One POST of text to path on endpoint at: 0 with *ret the JSON answer;
 * otherwise why is set and *kind says what the answer meant. secret: the
 * answer holds a token, never logged. */
static int post_one(struct etcd_http *H, size_t at, const char *path, const char *text, const char *token, bool secret,
		    json_t **ret, enum etcd_answer *kind)
{
	struct curl_slist *hdr = headers(token);
	char detail[CURL_ERROR_SIZE] = "";
	struct etcd_http_buf b = { 0 };
	CURL *c = hdr ? easy(H, at, path, text, hdr) : NULL;
	long code = 0;

	*ret = NULL;
	*kind = ANSWER_OTHER;
	if (!c) {
		curl_slist_free_all(hdr);
		return -ENOMEM;
	}
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)ETCD_TIMEOUT_MS);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, etcd_http_collect);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, detail);
	CURLcode cr = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
	curl_easy_cleanup(c);
	curl_slist_free_all(hdr);
	json_t *ans = b.p ? json_loads(b.p, 0, NULL) : NULL;
	if (b.p && secret)
		explicit_bzero(b.p, b.len);
	free(b.p);
	if (cr == CURLE_OK && code == 200 && ans)
		return *ret = ans, 0;
	const char *msg = answer_message(ans);
	*kind = answer_kind(msg);
	if (cr != CURLE_OK)
		why_set(H, "%s: %s%s", H->endpoints[at % H->n], detail[0] ? detail : curl_easy_strerror(cr),
			tls_hint(H->endpoints[at % H->n], cr, detail));
	else
		why_set(H, "%s: HTTP %ld: %.200s%s", H->endpoints[at % H->n], code, msg ? msg : "bad answer",
			answer_hint(H, *kind));
	log_debug("etcd %s%s: %s (HTTP %ld) %.200s", H->endpoints[at % H->n], path,
		  cr ? curl_easy_strerror(cr) : "bad answer", code, msg ? msg : "");
	json_decref(ans);
	return -EIO;
}

/* Log in at endpoint at: the token is kept for every request after. */
static int login_at(struct etcd_http *H, size_t at)
{
	json_auto_t *req = json_pack("{s:s, s:s}", "name", H->user, "password", H->password);
	char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_auto_t *ans = NULL;
	enum etcd_answer kind;
	int r;

	if (!text)
		return -ENOMEM;
	r = post_one(H, at, "/v3/auth/authenticate", text, NULL, true, &ans, &kind);
	free_secret(text);
	const char *t = json_string_value(json_object_get(ans, "token"));
	if (r == 0 && !t) {
		why_set(H, "%s: etcd answered the authentication without a token", H->endpoints[at % H->n]);
		r = -EIO;
	}
	if (r < 0)
		return kind == ANSWER_BAD_LOGIN ? -EACCES : r;
	char *copy = strdup(t);
	if (!copy)
		return -ENOMEM;
	pthread_mutex_lock(&H->mu);
	free_secret(H->token);
	H->token = copy;
	pthread_mutex_unlock(&H->mu);
	return 0;
}

int etcd_http_login(struct etcd_http *H, ckpt_error *err)
{
	char why[sizeof(H->why)];
	int r = -EIO;

	if (!H->user)
		return 0;
	for (size_t i = 0; i < H->n && r < 0 && r != -EACCES; i++)
		r = login_at(H, H->cur + i);
	if (r == 0)
		return 0;
	etcd_http_why(H, why, sizeof(why));
	return err_set(err, r == -EACCES ? EACCES : EHOSTUNREACH, NULL, "etcd authentication failed: %s", why);
}

/* text to path at endpoint at, logging in first when a user is configured
 * and we have no token, and once more when etcd says the token went stale. */
static int call_at(struct etcd_http *H, size_t at, const char *path, const char *text, json_t **ret)
{
	enum etcd_answer kind = ANSWER_OTHER;
	int r = -EIO;

	for (int round = 0; round < 2 && r < 0; round++) {
		_cleanup_(free_secretp) char *token = token_get(H);
		if (H->user && !token) {
			if ((r = login_at(H, at)) < 0)
				return r;
			token = token_get(H);
		}
		r = post_one(H, at, path, text, token, false, ret, &kind);
		if (r == 0 || kind != ANSWER_STALE_TOKEN || !H->user)
			return r;
		token_drop(H, token);
	}
	return r;
}

int etcd_http_call(struct etcd_http *H, const char *path, json_t *body, json_t **ret)
{
	_cleanup_free_ char *text = json_dumps(body, JSON_COMPACT);
	size_t start;
	int r = -EIO;

	json_decref(body);
	*ret = NULL;
	if (!text)
		return -ENOMEM;
	pthread_mutex_lock(&H->mu);
	start = H->cur;
	pthread_mutex_unlock(&H->mu);
	for (size_t i = 0; i < H->n && r < 0 && r != -ENOMEM; i++) {
		size_t at = (start + i) % H->n;
		if ((r = call_at(H, at, path, text, ret)) == 0) {
			pthread_mutex_lock(&H->mu);
			H->cur = at;
			pthread_mutex_unlock(&H->mu);
		}
	}
	return r < 0 ? (r == -ENOMEM ? r : -EIO) : 0;
}

CURLcode etcd_http_stream(struct etcd_http *H, size_t at, const char *path, const char *body, curl_write_callback write,
			  void *arg, curl_xferinfo_callback xfer, void *xarg)
{
	_cleanup_(free_secretp) char *token = token_get(H);
	CURLcode cr = CURLE_OUT_OF_MEMORY;

	if (H->user && !token) {
		if (login_at(H, at) < 0)
			return CURLE_LOGIN_DENIED;
		token = token_get(H);
	}
	struct curl_slist *hdr = headers(token);
	CURL *c = hdr ? easy(H, at, path, body, hdr) : NULL;
	if (c) {
		curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write);
		curl_easy_setopt(c, CURLOPT_WRITEDATA, arg);
		curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
		curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, xfer);
		curl_easy_setopt(c, CURLOPT_XFERINFODATA, xarg);
		cr = curl_easy_perform(c);
		curl_easy_cleanup(c);
	}
	curl_slist_free_all(hdr);
	return cr;
}

void etcd_http_stream_error(struct etcd_http *H, const char *message)
{
	log_debug("etcd watch: %s", message);
	if (answer_kind(message) == ANSWER_STALE_TOKEN)
		token_drop(H, NULL);
}
