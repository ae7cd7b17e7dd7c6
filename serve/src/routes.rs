//! The HTTP routes and what each answers.

use crate::peers::{ask, PeerAnswer};
use crate::Service;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value as JsonValue};
use std::collections::BTreeMap;
use std::sync::Arc;
use tidemark::operators::KeyRange;
use tidemark::runtime::{KeyLookup, KeyValues, StateQueryError, StoreDescription};

/// Query parameters that are not key columns.
const RESERVED: [&str; 3] = ["from", "to", "local"];

pub(crate) fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/v1/stores", get(stores))
        .route("/v1/stores/{store}/keys", get(key_in_query))
        .route("/v1/stores/{store}/keys/{key}", get(key_in_path))
        .route("/healthz", get(crate::connections::healthz))
        .with_state(service)
}

/// An answer: status, JSON body, and whether asking again may help.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: JsonValue,
}

impl Answer {
    fn ok(body: JsonValue) -> Self {
        Answer {
            status: StatusCode::OK,
            body,
        }
    }
    fn error(status: StatusCode, message: impl Into<String>) -> Self {
        Answer {
            status,
            body: json!({"error": message.into(), "retryable": false}),
        }
    }
    fn retry(message: impl Into<String>) -> Self {
        Answer {
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: json!({"error": message.into(), "retryable": true}),
        }
    }
    fn of_error(error: StateQueryError) -> Self {
        match error {
            e if e.is_retryable() => Answer::retry(e.to_string()),
            e @ StateQueryError::UnknownStore { .. } => {
                Answer::error(StatusCode::NOT_FOUND, e.to_string())
            }
            e => Answer::error(StatusCode::BAD_REQUEST, e.to_string()),
        }
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}

/// Runs `f` off the server's thread: reads wait for the query's loop. At
/// most `service.reads` requests wait at once; one more is told to retry
/// rather than queue without bound in front of the processing thread.
async fn blocking(service: &Service, f: impl FnOnce() -> Answer + Send + 'static) -> Answer {
    let Some(slot) = service.reads.try_take() else {
        return Answer::retry("too many requests at once: ask again shortly");
    };
    let answer = tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Answer::error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
    drop(slot);
    answer
}

async fn stores(State(service): State<Arc<Service>>) -> Answer {
    blocking(&service.clone(), move || match service.reader.stores() {
        Ok(stores) => Answer::ok(json!({ "stores": stores })),
        Err(e) => Answer::of_error(e),
    })
    .await
}

async fn key_in_query(
    State(service): State<Arc<Service>>,
    Path(store): Path<String>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Answer {
    blocking(&service.clone(), move || {
        read_key(&service, &store, None, &params)
    })
    .await
}

async fn key_in_path(
    State(service): State<Arc<Service>>,
    Path((store, key)): Path<(String, String)>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Answer {
    blocking(&service.clone(), move || {
        read_key(&service, &store, Some(key), &params)
    })
    .await
}

/// The key's state here, else from the instance holding it.
fn read_key(
    service: &Service,
    store: &str,
    path_key: Option<String>,
    params: &BTreeMap<String, String>,
) -> Answer {
    let stores = match service.reader.stores() {
        Ok(stores) => stores,
        Err(e) => return Answer::of_error(e),
    };
    let Some(description) = stores.iter().find(|s| s.name == store) else {
        let known: Vec<&str> = stores.iter().map(|s| s.name.as_str()).collect();
        return Answer::error(
            StatusCode::NOT_FOUND,
            format!("no store `{store}`; the query's stores: {known:?}"),
        );
    };
    let key = match key_of(description, path_key, params) {
        Ok(key) => key,
        Err(message) => return Answer::error(StatusCode::BAD_REQUEST, message),
    };
    let range = match range_of(params) {
        Ok(range) => range,
        Err(message) => return Answer::error(StatusCode::BAD_REQUEST, message),
    };
    let texts = description
        .key_columns
        .iter()
        .map(|c| key[c].clone())
        .collect();
    let lookup = service.reader.get(store, KeyValues::Text(texts), range);
    match lookup {
        Err(e) => Answer::of_error(e),
        Ok(KeyLookup::Found { partition, rows }) => Answer::ok(json!({
            "store": store,
            "key": key,
            "partition": partition,
            "served_by": service.advertised,
            "rows": rows,
        })),
        Ok(KeyLookup::NotHere { restoring, .. }) if !restoring.is_empty() => {
            Answer::retry(format!(
                "partitions {restoring:?} are restoring on {}: the key may be in one of them",
                service.advertised
            ))
        }
        Ok(KeyLookup::NotHere { partitions, .. }) => {
            let peers = match members(service) {
                Ok(peers) => peers,
                Err(answer) => return answer,
            };
            if let Some(answer) = tasks_pending(service, &peers, &partitions) {
                return answer;
            }
            match params.get("local").is_some_and(|v| v == "true") {
                true => not_found(store, &key),
                false => ask_peers(service, &peers, store, &key, params),
            }
        }
    }
}

/// The query's instances (none known without a directory: one instance).
fn members(service: &Service) -> Result<Vec<crate::Peer>, Answer> {
    match &service.peers {
        None => Ok(Vec::new()),
        Some(directory) => directory.peers().map_err(Answer::retry),
    }
}

/// A `503` when partitions the group assigned here have no running task
/// yet (the poll that starts them is to come), or this instance is not a
/// member yet: the key may be in one of them.
fn tasks_pending(service: &Service, peers: &[crate::Peer], running: &[i32]) -> Option<Answer> {
    service.peers.as_ref()?;
    let Some(me) = peers.iter().find(|p| p.advertised == service.advertised) else {
        return Some(Answer::retry(format!(
            "{} is not a member of the query's group yet",
            service.advertised
        )));
    };
    let pending: Vec<i32> = me
        .partitions
        .iter()
        .filter(|p| !running.contains(p))
        .copied()
        .collect();
    (!pending.is_empty()).then(|| {
        Answer::retry(format!(
            "partitions {pending:?} assigned to {} have not started yet",
            service.advertised
        ))
    })
}

/// Asks every other instance; the one holding the key answers.
fn ask_peers(
    service: &Service,
    peers: &[crate::Peer],
    store: &str,
    key: &BTreeMap<String, String>,
    params: &BTreeMap<String, String>,
) -> Answer {
    let range: Vec<(&str, &str)> = ["from", "to"]
        .iter()
        .filter_map(|p| params.get(*p).map(|v| (*p, v.as_str())))
        .collect();
    let mut unanswered = Vec::new();
    for peer in peers.iter().filter(|p| p.advertised != service.advertised) {
        match ask(peer, store, key, &range, service) {
            PeerAnswer::Found(body) => return Answer::ok(body),
            PeerAnswer::NotThere => {}
            PeerAnswer::Retry(reason) => unanswered.push(reason),
        }
    }
    if !unanswered.is_empty() {
        return Answer::retry(unanswered.join("; "));
    }
    not_found(store, key)
}

fn not_found(store: &str, key: &BTreeMap<String, String>) -> Answer {
    Answer {
        status: StatusCode::NOT_FOUND,
        body: json!({
            "store": store,
            "key": key,
            "found": false,
            "error": "no instance holds state for this key",
            "retryable": false,
        }),
    }
}

/// The key's columns and text values: the path's value for a store keyed
/// by one column, else one query parameter per key column (a key column
/// named `from`, `to` or `local` cannot be given: those are reserved).
fn key_of(
    description: &StoreDescription,
    path_key: Option<String>,
    params: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let columns = &description.key_columns;
    let name = &description.name;
    let key = match (path_key, columns.as_slice()) {
        (Some(value), [column]) => BTreeMap::from([(column.clone(), value)]),
        (Some(_), _) => {
            let query: Vec<String> = columns.iter().map(|c| format!("{c}=...")).collect();
            return Err(format!(
                "store `{name}` is keyed by {columns:?}: ask /v1/stores/{name}/keys?{}",
                query.join("&")
            ));
        }
        (None, _) => {
            let mut key = BTreeMap::new();
            for column in columns {
                let Some(value) = params.get(column) else {
                    return Err(format!(
                        "store `{name}` is keyed by {columns:?}: the key column `{column}` is missing"
                    ));
                };
                key.insert(column.clone(), value.clone());
            }
            key
        }
    };
    let unknown: Vec<&String> = params
        .keys()
        .filter(|p| !key.contains_key(*p) && !RESERVED.contains(&p.as_str()))
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "unknown parameters {unknown:?}: store `{name}` is keyed by {columns:?}; also allowed: from, to"
        ));
    }
    Ok(key)
}

/// `from` and `to`: RFC 3339 times or epoch milliseconds.
fn range_of(params: &BTreeMap<String, String>) -> Result<KeyRange, String> {
    let time = |name: &str| -> Result<Option<i64>, String> {
        let Some(text) = params.get(name) else {
            return Ok(None);
        };
        if let Ok(millis) = text.parse::<i64>() {
            return Ok(Some(millis.saturating_mul(1000)));
        }
        tidemark::time::parse_rfc3339(text).map(Some).ok_or_else(|| {
            format!("`{name}` = `{text}` is not a time: give RFC 3339 (2026-01-01T10:00:00Z) or epoch milliseconds")
        })
    };
    Ok(KeyRange {
        from: time("from")?,
        to: time("to")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(columns: &[&str]) -> StoreDescription {
        StoreDescription {
            name: "op1".into(),
            operator: "agg".into(),
            kind: "window_aggregate".into(),
            key_columns: columns.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn a_composite_key_is_read_from_the_query_and_each_column_is_needed() {
        let params = BTreeMap::from([
            ("id".to_string(), "a".to_string()),
            ("region".to_string(), "eu".to_string()),
            ("from".to_string(), "0".to_string()),
        ]);
        let key = key_of(&store(&["id", "region"]), None, &params).unwrap();
        assert_eq!(key["region"], "eu");
        let missing = key_of(&store(&["id", "region", "shop"]), None, &params).unwrap_err();
        assert!(missing.contains("`shop` is missing"), "{missing}");
        let path = key_of(&store(&["id", "region"]), Some("a".into()), &params).unwrap_err();
        assert!(path.contains("keys?id=...&region=..."), "{path}");
    }

    struct Members(Vec<crate::Peer>);

    impl crate::PeerDirectory for Members {
        fn peers(&self) -> Result<Vec<crate::Peer>, String> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn partitions_assigned_here_but_not_started_make_a_miss_retryable() {
        let me = crate::Peer {
            advertised: "a:1".into(),
            partitions: vec![0, 2],
        };
        let service = Service {
            reader: tidemark::runtime::StateService::default().reader(),
            advertised: "a:1".into(),
            peers: Some(Arc::new(Members(vec![me.clone()]))),
            reads: crate::connections::ReadSlots::new(1),
            auth_token: None,
            peer_tls: None,
        };
        let peers = members(&service).unwrap();
        let pending = tasks_pending(&service, &peers, &[0]).expect("partition 2 pending");
        assert_eq!(pending.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(pending.body["error"].as_str().unwrap().contains("[2]"));
        assert!(tasks_pending(&service, &peers, &[0, 2]).is_none());
        let stranger = Service {
            advertised: "b:1".into(),
            ..service
        };
        let answer = tasks_pending(&stranger, &peers, &[]).expect("not a member");
        assert_eq!(answer.body["retryable"], true);
    }

    #[test]
    fn a_range_takes_rfc3339_or_milliseconds_and_names_a_bad_bound() {
        let params = BTreeMap::from([
            ("from".to_string(), "2026-01-01T10:00:00Z".to_string()),
            ("to".to_string(), "1767261600000".to_string()),
        ]);
        let range = range_of(&params).unwrap();
        assert_eq!(range.from, range.to);
        let bad = BTreeMap::from([("to".to_string(), "soon".to_string())]);
        assert!(range_of(&bad).unwrap_err().contains("`to` = `soon`"));
    }
}
