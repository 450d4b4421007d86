use super::*;

#[tokio::test(start_paused = true)]
async fn the_steps_of_one_call_share_its_database_time() {
    let time = DatabaseTime::new(Duration::from_millis(100));
    let outcome = time
        .scope(async {
            let first = time.bounded("first", tokio::time::sleep(Duration::from_millis(60))).await;
            let second = time.bounded("second", tokio::time::sleep(Duration::from_millis(60))).await;
            (first, second)
        })
        .await;
    assert_eq!(outcome.0, Ok(()));
    assert_eq!(outcome.1, Err(OutOfDatabaseTime { during: "second", after: Duration::from_millis(100) }));
    // Outside a scope, a step has the whole time.
    assert_eq!(time.bounded("alone", tokio::time::sleep(Duration::from_millis(90))).await, Ok(()));
}
